"""End to end on bare metal, the topology of docker-compose.yml: PostgreSQL, `twinwatch serve`,
a real Prometheus with the project's scrape config and alert rules, and `twinwatch twin` posting
the lab's faults, accelerated. Every lab fault must show up in all three places: an alarm row in
PostgreSQL, an alarm in `twinwatch_alarm_active` scraped by Prometheus, and a firing alert.

Time is compressed twice, consistently. The twin runs at SPEED x real time, and Prometheus's
intervals, the rules' ranges and `for` durations are all divided by TIME_SCALE (15 s scrapes
become 0.5 s), so a range that spans four scrapes in production spans four here. The faults sit
80+ samples (4 s at SPEED 2) apart, more than the 2 s window of TwinwatchAlarmRaised, so each
fault's evidence is told apart by time: we map samples to wall-clock time through Prometheus's
own scrapes of `twinwatch_readings_total`, and require each alarm and alert to START inside its
fault's window, so an alarm left over from the previous fault cannot stand in for a missed one.

Needs `prometheus` on PATH and TWINWATCH_TEST_DATABASE_URL (CI sets both); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text

from app.monitoring.evaluation import DETECTION_MARGIN
from app.simulation.faults import LAB_FAULTS, Fault
from tests.integration.conftest import fresh_schema, postgres_url

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "prometheus"

TIME_SCALE = 30  # production 15 s scrapes -> 0.5 s here
SPEED = 2.0  # 20 readings per second
START, STOP = 6850, 8000  # warm-up, then the four faults and their recovery: 57.5 s
STREAM = "e2e-pump"
SCRAPE_S = 15 / TIME_SCALE
STARTUP_LIMIT_S = 90.0
TWIN_LIMIT_S = (STOP - START) / (10 * SPEED) + 90

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus is not installed (Debian package prometheus); CI installs it",
    ),
    pytest.mark.skipif(
        postgres_url() is None, reason="TWINWATCH_TEST_DATABASE_URL is not set; CI sets it"
    ),
]


# --- time compression of the project's configuration --------------------------------------------

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


def test_scaling_keeps_every_duration_in_proportion() -> None:
    assert scale_duration("15s") == "500ms"
    assert scale_duration("1m") == "2000ms"
    assert scale_duration("1h30m") == "180000ms"
    assert scale_expr("x unless x offset 1m") == "x unless x offset 2000ms"
    assert scale_expr("increase(x[1m]) > 0 and max_over_time(y[1h]) > 0") == (
        "increase(x[2000ms]) > 0 and max_over_time(y[120000ms]) > 0"
    )


def compressed_config(directory: Path, app_port: int) -> Path:
    """prometheus.yml and alerts.yml of deploy/, pointed at `app_port`, time compressed."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    scrape = scale_duration(config["global"]["scrape_interval"])
    config["global"] = {
        "scrape_interval": scrape,
        "scrape_timeout": scrape,
        "evaluation_interval": scale_duration(config["global"]["evaluation_interval"]),
    }
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{app_port}"]}]
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


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_LIMIT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"{process.args} exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{url} did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


class Processes:
    """Started processes, each with its log file; all stopped at the end, whatever happened."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.directory
            )
        self.started.append(process)
        return process, log

    def stop_all(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                process.terminate()
        for process in self.started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def twinwatch(*args: str) -> list[str]:
    return [sys.executable, "-c", "from app.cli import main; main()", *args]


@dataclass
class Deployment:
    app: str
    prometheus: str
    database_url: str
    processes: Processes
    server: subprocess.Popen[bytes]

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": promql}).json()
        assert answer["status"] == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def firing(self) -> set[str]:
        alerts = httpx.get(f"{self.prometheus}/api/v1/alerts").json()["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, calibrated_models: Path
) -> Iterator[Deployment]:
    directory = tmp_path_factory.mktemp("e2e")
    base_url = postgres_url()
    assert base_url is not None
    app_port, prometheus_port = free_port(), free_port()
    with fresh_schema(base_url) as database_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
        env |= {
            "TWINWATCH_DATABASE_URL": database_url,
            "TWINWATCH_MODELS_DIR": str(calibrated_models),
            "TWINWATCH_DEFAULT_MODEL": "lstm-seed0",
            "TWINWATCH_DATA_DIR": str(directory / "data"),
            "TWINWATCH_HOST": "127.0.0.1",
            "TWINWATCH_PORT": str(app_port),
            "TWINWATCH_MIGRATE_ON_START": "false",
            "TWINWATCH_LOG_LEVEL": "warning",
            # As the compose stack runs: every per-stream series (readings counted per stream).
            "TWINWATCH_METRICS_PER_STREAM": "all",
        }
        processes = Processes(directory, env)
        try:
            # What the image's entrypoint does: migrate, then serve.
            subprocess.run(twinwatch("db", "upgrade"), env=env, check=True, capture_output=True)
            server, server_log = processes.start("serve", *twinwatch("serve"))
            app = f"http://127.0.0.1:{app_port}"
            wait_until(f"{app}/readyz", server, server_log)
            config = compressed_config(directory, app_port)
            prometheus, prometheus_log = processes.start(
                "prometheus",
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            )
            url = f"http://127.0.0.1:{prometheus_port}"
            wait_until(f"{url}/-/ready", prometheus, prometheus_log)
            deployment = Deployment(app, url, database_url, processes, server)
            deadline = time.monotonic() + 30
            while not any(r["value"][1] == "1" for r in deployment.query('up{job="twinwatch"}')):
                assert time.monotonic() < deadline, "Prometheus never scraped the service"
                time.sleep(SCRAPE_S)
            yield deployment
        finally:
            processes.stop_all()


@pytest.fixture(scope="module")
def lab_run(deployment: Deployment) -> str:
    """The twin's lab scenario, accelerated; returns its output."""
    twin, log = deployment.processes.start(
        "twin",
        *twinwatch(
            "twin",
            "--url",
            deployment.app,
            "--stream",
            STREAM,
            "--faults",
            "lab",
            "--start",
            str(START),
            "--samples",
            str(STOP - START),
            "--speed",
            str(SPEED),
        ),
    )
    try:
        twin.wait(timeout=TWIN_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the twin did not finish:\n{log.read_text()[-3000:]}")
    output = log.read_text()
    assert twin.returncode == 0, output
    time.sleep(4 * SCRAPE_S)  # the last alarms' scrapes and rule evaluations
    return output


# --- evidence -------------------------------------------------------------------------------


def raw_samples(deployment: Deployment, selector: str) -> list[dict[str, Any]]:
    """Every stored sample of the series `selector` (a range query over the whole run)."""
    return deployment.query(f"{selector}[15m]")


def ingest_clock(deployment: Deployment) -> list[tuple[float, float]]:
    """(scrape time, readings accepted so far) of the twin's stream."""
    (series,) = raw_samples(deployment, f'twinwatch_readings_total{{stream="{STREAM}"}}')
    return [(float(t), float(v)) for t, v in series["values"]]


def ingested_at(clock: list[tuple[float, float]], sample: int) -> float:
    """The first scrape at which `sample`'s reading had been accepted."""
    needed = sample - START + 1
    return next(t for t, count in clock if count >= needed)


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


def window(clock: list[tuple[float, float]], fault: Fault) -> tuple[float, float]:
    """Wall-clock span in which alarms of `fault` start: from the scrape that first saw the
    fault's first reading to the scrape that saw the last sample that may still raise one,
    plus one scrape and one rule evaluation of slack."""
    last = min(fault.end + DETECTION_MARGIN - 1, STOP - 1)
    return ingested_at(clock, fault.start), ingested_at(clock, last) + 2 * SCRAPE_S


def test_the_twin_sent_the_whole_lab_scenario(lab_run: str) -> None:
    last = lab_run.strip().splitlines()[-1]
    assert last.startswith(f"done: sent {STOP - START} readings"), last
    assert "retries 0" in last


def test_every_lab_fault_has_an_alarm_row_in_postgresql(
    deployment: Deployment, lab_run: str
) -> None:
    engine = create_engine(deployment.database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT detector, opened_sample FROM alarms WHERE stream_id = :s"),
                {"s": STREAM},
            ).all()
    finally:
        engine.dispose()
    for fault in LAB_FAULTS:
        caught = {
            detector
            for detector, opened in rows
            if fault.start <= START + opened < fault.end + DETECTION_MARGIN
        }
        assert caught, f"no alarm row for the {fault.type.value} fault at {fault.start}"


def test_every_lab_fault_shows_in_the_scraped_alarm_metric(
    deployment: Deployment, lab_run: str
) -> None:
    clock = ingest_clock(deployment)
    assert clock[-1][1] == STOP - START
    series = raw_samples(deployment, f'twinwatch_alarm_active{{stream="{STREAM}"}}')
    for fault in LAB_FAULTS:
        lo, hi = window(clock, fault)
        seen = {
            s["metric"]["detector"]
            for s in series
            for edge in rising_edges(s, gap_s=3 * SCRAPE_S)
            if lo <= edge <= hi
        }
        assert seen, f"twinwatch_alarm_active never rose during the {fault.type.value} fault"
    # The same, as a dashboard would ask: which detectors were ever active during the run.
    peaks = deployment.query(f'max_over_time(twinwatch_alarm_active{{stream="{STREAM}"}}[15m])')
    assert {p["metric"]["detector"] for p in peaks if p["value"][1] == "1"} >= {
        "point",
        "rolling_rms",
        "variance_floor",
    }


def test_every_lab_fault_fired_an_alert(deployment: Deployment, lab_run: str) -> None:
    clock = ingest_clock(deployment)
    alerts = raw_samples(
        deployment,
        f'ALERTS{{alertname=~"TwinwatchAlarm(Active|Raised)",alertstate="firing",'
        f'stream="{STREAM}"}}',
    )
    assert alerts, "no alarm alert ever fired"
    for fault in LAB_FAULTS:
        lo, hi = window(clock, fault)
        fired = {
            (a["metric"]["alertname"], a["metric"]["detector"])
            for a in alerts
            for edge in rising_edges(a, gap_s=3 * SCRAPE_S)
            if lo <= edge <= hi
        }
        assert fired, f"no alert fired for the {fault.type.value} fault at {fault.start}"
        assert any(name == "TwinwatchAlarmRaised" for name, _ in fired), fault.type.value
    labels = alerts[0]["metric"]
    assert labels["stream"] == STREAM and labels["severity"] == "warning"


def test_the_dashboard_queries_return_data(deployment: Deployment, lab_run: str) -> None:
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/twinwatch.json").read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert expressions
    for expr in expressions:
        promql = (
            expr.replace("$stream", STREAM)
            .replace('"$detector"', '~".+"')
            .replace("$__rate_interval", "15m")
        )
        assert deployment.query(promql), f"no data for {promql}"


def test_a_stopped_stream_and_a_dead_service_raise_their_alerts(
    deployment: Deployment, lab_run: str
) -> None:
    # The twin has finished: its stream goes quiet.
    deadline = time.monotonic() + 60
    while "TwinwatchStreamStopped" not in deployment.firing():
        assert time.monotonic() < deadline, "TwinwatchStreamStopped never fired"
        time.sleep(SCRAPE_S)
    assert "TwinwatchDown" not in deployment.firing()
    deployment.server.send_signal(signal.SIGTERM)
    deployment.server.wait(timeout=30)
    deadline = time.monotonic() + 60
    while "TwinwatchDown" not in deployment.firing():
        assert time.monotonic() < deadline, "TwinwatchDown never fired"
        time.sleep(SCRAPE_S)
