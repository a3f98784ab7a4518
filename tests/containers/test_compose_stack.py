"""The compose stack users run, started for real: docker-compose.yml with a container engine,
PostgreSQL and Prometheus in their containers (built from Debian's packages where the official
images cannot be pulled: deploy/compose.ci.yml), the app's image, and the twin container
posting the lab's four faults at real time. Each fault must leave an alarm row in the
PostgreSQL container and fire an alert in the Prometheus container (read through its HTTP API),
and the stack must come down. Twice: as docker-compose.yml runs it, and scaled out on the bus
(docker-compose.bus.yml: NATS with JetStream and two workers, every reading committed by a
worker, Prometheus scraping both).

`deploy/container-check.sh` builds the images and runs this module (it is collected only when
TWINWATCH_CONTAINER_STACK is set: `tests/conftest.py`). Prometheus reads the project's scrape
config and alert rules with every interval divided by one factor (`tests/support/prometheus.py`),
so each fault's alert is told apart from the next one's.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.simulation.faults import LAB_FAULTS
from tests.e2e.conftest import free_port
from tests.support.prometheus import (
    SCRAPE_S,
    alarm_rows_by_fault,
    alerts_by_fault,
    compressed_config,
    ingest_clock,
    query,
)

REPO = Path(__file__).resolve().parents[2]
ENGINE = os.environ.get("TWINWATCH_CONTAINER_ENGINE", "podman")
COMPOSE = shlex.split(os.environ.get("TWINWATCH_COMPOSE", "podman-compose"))
PROJECT = "twinwatch-stack-check"
STREAM = "pump-1"  # docker-compose.yml's twin: samples 6800..7999 of its run, at real time
START, STOP = 6800, 8000
READY_LIMIT_S = 120.0
TWIN_LIMIT_S = (STOP - START) / 10 + 90

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, check=False)


FILES = {
    "embedded": ["docker-compose.yml", "deploy/compose.ci.yml"],
    "bus": [
        "docker-compose.yml",
        "docker-compose.bus.yml",
        "deploy/compose.ci.yml",
        "deploy/compose.bus.ci.yml",
    ],
}
WORKERS = 2  # docker-compose.bus.yml's default


@dataclass
class Stack:
    env: dict[str, str]
    app: str
    prometheus: str
    variant: str

    @property
    def files(self) -> list[str]:
        return [option for name in FILES[self.variant] for option in ("-f", name)]

    def compose(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = run(*COMPOSE, "-p", PROJECT, *self.files, *args, env=self.env)
        assert result.returncode == 0, f"compose {args}:\n{result.stdout}\n{result.stderr}"
        return result

    def container(self, service: str) -> str:
        return f"{PROJECT}_{service}_1"  # podman-compose's (and docker-compose 1's) names

    def logs(self, service: str) -> str:
        result = run(ENGINE, "logs", "--tail", "40", self.container(service))
        return result.stdout + result.stderr

    def query(self, promql: str) -> list[dict[str, Any]]:
        return query(self.prometheus, promql)

    def wait(self, service: str, ready: Any) -> None:
        deadline = time.monotonic() + READY_LIMIT_S
        while True:
            try:
                if ready():
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{service} was not ready:\n{self.logs(service)}")
            time.sleep(0.5)


@pytest.fixture(scope="module", params=sorted(FILES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    config = tmp_path_factory.mktemp("prometheus")
    compressed_config(config)  # scraping app:8000, as docker-compose.yml's own file does
    config.chmod(0o755)  # Prometheus runs as nobody in its container
    for path in config.iterdir():
        path.chmod(0o644)
    app_port, prometheus_port = free_port(), free_port()
    env = {
        **os.environ,
        "PROMETHEUS_CONFIG_DIR": str(config),
        "TWINWATCH_PUBLISHED_PORT": str(app_port),
        "PROMETHEUS_PUBLISHED_PORT": str(prometheus_port),
    }
    stack = Stack(
        env, f"http://127.0.0.1:{app_port}", f"http://127.0.0.1:{prometheus_port}", request.param
    )
    try:
        # In dependency order, each waited for: not every compose tool waits on health checks.
        stack.compose("up", "-d", "postgres")
        stack.wait(
            "postgres",
            lambda: (
                run(
                    ENGINE,
                    "exec",
                    stack.container("postgres"),
                    "pg_isready",
                    "-q",
                    "--host=127.0.0.1",  # over TCP: the initialisation's server has none
                    "--username=twinwatch",
                ).returncode
                == 0
            ),
        )
        if stack.variant == "bus":
            stack.compose("up", "-d", "nats")
            stack.wait(
                "nats",
                lambda: run(ENGINE, "healthcheck", "run", stack.container("nats")).returncode == 0,
            )
        stack.compose("up", "-d", "app")
        stack.wait("app", lambda: httpx.get(f"{stack.app}/readyz").status_code == 200)
        if stack.variant == "bus":
            stack.compose("up", "-d", "worker")
        stack.compose("up", "-d", "prometheus")
        stack.wait(
            "prometheus",
            lambda: any(v["value"][1] == "1" for v in stack.query('up{job="twinwatch"}')),
        )
        if stack.variant == "bus":  # both workers found by name, scraped, and serving
            stack.wait(
                "worker",
                lambda: (
                    [v["value"][1] for v in stack.query('up{job="twinwatch-workers"}')]
                    == ["1"] * WORKERS
                ),
            )
        yield stack
    finally:
        run(*COMPOSE, "-p", PROJECT, *stack.files, "down", "-v", env=env)
        run(ENGINE, "network", "rm", "--force", f"{PROJECT}_default")  # (podman-compose keeps it)


@pytest.fixture(scope="module")
def lab_pass(stack: Stack) -> None:
    """The twin container's first pass over the lab record (it loops: stopped after it)."""
    stack.compose("up", "-d", "twin")
    deadline = time.monotonic() + TWIN_LIMIT_S
    while True:
        answer = httpx.get(f"{stack.app}/v1/streams/{STREAM}")
        if answer.status_code == 200 and answer.json()["samples_seen"] >= STOP - START:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the twin did not send its pass:\n{stack.logs('twin')}")
        time.sleep(1)
    assert run(ENGINE, "stop", "--time", "10", stack.container("twin")).returncode == 0
    time.sleep(4 * SCRAPE_S)  # the last alarms' scrapes and rule evaluations


def test_every_lab_fault_has_an_alarm_row_in_the_postgresql_container(
    stack: Stack, lab_pass: None
) -> None:
    sql = f"SELECT detector, opened_sample FROM alarms WHERE stream_id = '{STREAM}'"
    result = run(
        ENGINE, "exec", stack.container("postgres"),
        "psql", "-U", "twinwatch", "-d", "twinwatch", "-At", "-F", "|", "-c", sql,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [
        (detector, int(opened))
        for detector, opened in (line.split("|") for line in result.stdout.splitlines())
    ]
    for fault, caught in alarm_rows_by_fault(rows, LAB_FAULTS, start=START).items():
        assert caught, f"no alarm row for the {fault} fault in the PostgreSQL container: {rows}"


def scraped_through(stack: Stack, readings: int, limit_s: float = 120.0) -> None:
    """Wait until Prometheus has scraped the stream with `readings` readings accepted (the
    twin's pass ends before the next scrape: a loaded machine scrapes late), and the alert
    rules have been evaluated after that scrape."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            clock = ingest_clock(stack.query, STREAM)
        except ValueError:  # (no series yet)
            clock = []
        if clock and clock[-1][1] >= readings:
            time.sleep(2 * SCRAPE_S)
            return
        if time.monotonic() > deadline:
            pytest.fail(f"Prometheus did not scrape {readings} readings in {limit_s:.0f} s")
        time.sleep(1.0)


def test_every_lab_fault_fired_an_alert_in_the_prometheus_container(
    stack: Stack, lab_pass: None
) -> None:
    scraped_through(stack, STOP - START)
    fired = alerts_by_fault(stack.query, STREAM, LAB_FAULTS, start=START, stop=STOP)
    for fault, alerts in fired.items():
        assert alerts, f"no alert fired for the {fault} fault in the Prometheus container"
        assert any(name == "TwinwatchAlarmRaised" for name, _ in alerts), fault


def test_the_stack_comes_down(stack: Stack, lab_pass: None) -> None:
    stack.compose("down", "-v")
    left = run(ENGINE, "ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert not [name for name in left if name.startswith(f"{PROJECT}_")], left
