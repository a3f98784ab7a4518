"""A real Prometheus over the project's scrape config and alert rules, with time compressed, and
the evidence the end-to-end tests read from it (the bare-metal one and the compose stack's).

Prometheus's intervals, the rules' ranges and `for` durations are all divided by one factor
(15 s scrapes become 0.5 s at TIME_SCALE 30), so a range that spans four scrapes in production
spans four here. Samples are mapped to wall-clock time through Prometheus's own scrapes of
`twinwatch_readings_total`, and each alarm and alert must START inside its fault's window, so an
alarm left over from the previous fault cannot stand in for a missed one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.monitoring.evaluation import DETECTION_MARGIN
from app.simulation.faults import Fault

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
TIME_SCALE = 30  # production 15 s scrapes -> 0.5 s here
SCRAPE_S = 15 / TIME_SCALE

Query = Callable[[str], list[dict[str, Any]]]

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"^(?:\d+(?:ms|[smhdw]))+$")


def scale_duration(duration: str) -> str:
    """'1m' -> '2000ms' at TIME_SCALE 30."""
    if not _DURATION.match(duration):
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    total = sum(int(n) * _UNITS_MS[unit] for n, unit in re.findall(r"(\d+)(ms|[smhdw])", duration))
    return f"{max(1, round(total / TIME_SCALE))}ms"


def scale_expr(expr: str) -> str:
    """Range selectors and offsets."""
    expr = re.sub(r"\[([0-9a-z]+)\]", lambda m: f"[{scale_duration(m.group(1))}]", expr)
    return re.sub(r"offset ([0-9a-z]+)", lambda m: f"offset {scale_duration(m.group(1))}", expr)


def compressed_config(
    directory: Path, target: str | None = None, source: str = "prometheus.yml"
) -> Path:
    """A Prometheus configuration of deploy/ (`source`) and alerts.yml, time compressed,
    written to `directory`; the scrape pointed at `target` (host:port) if given, else at the
    file's own."""
    config = yaml.safe_load((DEPLOY / source).read_text())
    scrape = scale_duration(config["global"]["scrape_interval"])
    config["global"] = {
        "scrape_interval": scrape,
        "scrape_timeout": scrape,
        "evaluation_interval": scale_duration(config["global"]["evaluation_interval"]),
    }
    for job in config["scrape_configs"]:
        for discovery in job.get("dns_sd_configs", []):
            discovery["refresh_interval"] = scale_duration(discovery["refresh_interval"])
    if target is not None:  # bare metal: the service alone, at `target`
        (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "twinwatch"]
        job["static_configs"] = [{"targets": [target]}]
        config["scrape_configs"] = [job]
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["expr"] = scale_expr(rule["expr"])
            if "for" in rule:
                rule["for"] = scale_duration(rule["for"])
    for name in config["rule_files"]:
        (directory / name).write_text(yaml.safe_dump(rules, sort_keys=False))
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    """An instant query to the Prometheus at `prometheus` (its base URL)."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}).json()
    assert answer["status"] == "success", (promql, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def raw_samples(query: Query, selector: str) -> list[dict[str, Any]]:
    """Every stored sample of the series `selector` (a range query over the whole run)."""
    return query(f"{selector}[15m]")


def ingest_clock(query: Query, stream: str) -> list[tuple[float, float]]:
    """(scrape time, readings accepted so far) of the stream, from the process that accepted
    them: on the bus the API keeps the stream's series at zero beside the worker's."""
    found = raw_samples(query, f'twinwatch_readings_total{{stream="{stream}"}}')
    series = max(found, key=lambda one: float(one["values"][-1][1]))
    return [(float(t), float(v)) for t, v in series["values"]]


def ingested_at(clock: list[tuple[float, float]], readings: int) -> float:
    """The first scrape at which the stream had accepted `readings` readings."""
    return next(t for t, count in clock if count >= readings)


def rising_edges(series: dict[str, Any], gap_s: float) -> list[float]:
    """Times at which a 0/1 series (or a series that exists only while true) became 1."""
    edges = []
    previous_t, previous_v = None, 0.0
    for t_raw, v_raw in series["values"]:
        t, v = float(t_raw), float(v_raw)
        lost = previous_t is not None and t - previous_t > gap_s
        if v == 1 and (previous_v != 1 or previous_t is None or lost):
            edges.append(t)
        previous_t, previous_v = t, v
    return edges


def window(
    clock: list[tuple[float, float]], fault: Fault, *, start: int, stop: int
) -> tuple[float, float]:
    """Wall-clock span in which alarms of `fault` start, for a twin that sent samples
    [start, stop): from the scrape that first saw the fault's first reading to the scrape that
    saw the last sample that may still raise one, plus one scrape and one rule evaluation of
    slack."""
    last = min(fault.end + DETECTION_MARGIN - 1, stop - 1)
    return (
        ingested_at(clock, fault.start - start + 1),
        ingested_at(clock, last - start + 1) + 2 * SCRAPE_S,
    )


def alerts_by_fault(
    query: Query, stream: str, faults: tuple[Fault, ...], *, start: int, stop: int
) -> dict[str, set[tuple[str, str]]]:
    """For each fault: the (alert, detector) pairs of the alarm alerts that started firing in
    its window."""
    clock = ingest_clock(query, stream)
    alerts = raw_samples(
        query,
        f'ALERTS{{alertname=~"TwinwatchAlarm(Active|Raised)",alertstate="firing",'
        f'stream="{stream}"}}',
    )
    fired = {}
    for fault in faults:
        lo, hi = window(clock, fault, start=start, stop=stop)
        fired[fault.type.value] = {
            (a["metric"]["alertname"], a["metric"]["detector"])
            for a in alerts
            for edge in rising_edges(a, gap_s=3 * SCRAPE_S)
            if lo <= edge <= hi
        }
    return fired


def alarm_rows_by_fault(
    rows: list[tuple[str, int]], faults: tuple[Fault, ...], *, start: int
) -> dict[str, set[str]]:
    """For each fault: the detectors of the alarm rows (detector, opened sample of the stream,
    which began at twin sample `start`) that opened during it or its detection margin."""
    return {
        fault.type.value: {
            detector
            for detector, opened in rows
            if fault.start <= start + opened < fault.end + DETECTION_MARGIN
        }
        for fault in faults
    }
