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
from sqlalchemy import create_engine, text

from app.simulation.faults import LAB_FAULTS
from tests.integration.conftest import fresh_schema, postgres_url
from tests.support.prometheus import (
    SCRAPE_S,
    alarm_rows_by_fault,
    alerts_by_fault,
    compressed_config,
    ingest_clock,
    query,
    raw_samples,
    rising_edges,
    scale_duration,
    scale_expr,
    window,
)

REPO = Path(__file__).resolve().parents[2]

SPEED = 2.0  # 20 readings per second
START, STOP = 6850, 8000  # warm-up, then the four faults and their recovery: 57.5 s
STREAM = "e2e-pump"
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


def test_scaling_keeps_every_duration_in_proportion() -> None:
    assert scale_duration("15s") == "500ms"
    assert scale_duration("1m") == "2000ms"
    assert scale_duration("1h30m") == "180000ms"
    assert scale_expr("x unless x offset 1m") == "x unless x offset 2000ms"
    assert scale_expr("increase(x[1m]) > 0 and max_over_time(y[1h]) > 0") == (
        "increase(x[2000ms]) > 0 and max_over_time(y[120000ms]) > 0"
    )


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
        return query(self.prometheus, promql)

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
            config = compressed_config(directory, f"127.0.0.1:{app_port}")
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
    for fault, caught in alarm_rows_by_fault(rows, LAB_FAULTS, start=START).items():
        assert caught, f"no alarm row for the {fault} fault"


def test_every_lab_fault_shows_in_the_scraped_alarm_metric(
    deployment: Deployment, lab_run: str
) -> None:
    clock = ingest_clock(deployment.query, STREAM)
    assert clock[-1][1] == STOP - START
    series = raw_samples(deployment.query, f'twinwatch_alarm_active{{stream="{STREAM}"}}')
    for fault in LAB_FAULTS:
        lo, hi = window(clock, fault, start=START, stop=STOP)
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
    fired = alerts_by_fault(deployment.query, STREAM, LAB_FAULTS, start=START, stop=STOP)
    for fault, alerts in fired.items():
        assert alerts, f"no alert fired for the {fault} fault"
        assert any(name == "TwinwatchAlarmRaised" for name, _ in alerts), fault
    (labels,) = {
        (a["metric"]["stream"], a["metric"]["severity"])
        for a in deployment.query(f'ALERTS{{stream="{STREAM}"}}[15m]')
    }
    assert labels == (STREAM, "warning")


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
