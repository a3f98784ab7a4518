"""End-to-end helpers: real `twinwatch serve` processes on real databases with the real model.

`ServeProcess` starts the service as a subprocess on a loopback port and can kill it with SIGKILL
and start it again on the same database. `calibrated_models` is a copy of `lstm-seed0`
whose thresholds were calibrated on the lab's hold-out (the shipped artifact has none, and a
stream cannot be created without them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.integration.conftest import empty_database, postgres_url
from tests.support.models import calibrated_lab_model

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = "lstm-seed0"
READY_LIMIT_S = 90.0
SERVE = (sys.executable, "-c", "from app.cli import main; main()", "serve")

# PostgreSQL joins only when configured (as in tests/integration), so a laptop run stays quiet.
E2E_BACKENDS = ["sqlite"] + (
    [pytest.param("postgresql", marks=pytest.mark.postgres)] if postgres_url() else []
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """`twinwatch serve` in a subprocess; every start logs to its own file under `log_dir`."""

    def __init__(self, name: str, *, database_url: str, models_dir: Path, log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
        self.env = env | {
            "TWINWATCH_DATABASE_URL": database_url,
            "TWINWATCH_MODELS_DIR": str(models_dir),
            "TWINWATCH_DEFAULT_MODEL": "lstm-seed0",
            "TWINWATCH_DATA_DIR": str(log_dir / f"{name}-data"),
            "TWINWATCH_MIGRATE_ON_START": "true",
            "TWINWATCH_LOG_LEVEL": "warning",
            # Restarts and pauses are the point here: no stale alarm races the comparisons.
            "TWINWATCH_STALE_PERIODS": "0",
        }

    def launch(self) -> None:
        """Start the process without waiting (so two servers can import torch side by side)."""
        assert self.process is None, "already running"
        self.starts += 1
        self._log = (self.log_dir / f"{self.name}-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            [*SERVE, "--port", str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        """Until `/readyz` answers 200 (database reachable, model loaded)."""
        assert self.process is not None
        deadline = time.monotonic() + READY_LIMIT_S
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} was not ready after {READY_LIMIT_S} s:\n{self.log()}")
            time.sleep(0.05)

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def kill(self) -> None:
        """SIGKILL: no shutdown handler, no flush, no goodbye."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(sig)
            self.process.wait(timeout=30)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        path = self.log_dir / f"{self.name}-{self.starts}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def as_a_user_runs_it(name: str, directory: Path) -> ServeProcess:
    """A server (not started) with the service's own defaults, as the README's reader has them
    (its shipped models, no default model override, the stale timer on), on a SQLite file in
    `directory`."""
    server = ServeProcess(
        name,
        database_url=f"sqlite:///{directory / 'data' / 'twinwatch.db'}",
        models_dir=directory / "models",
        log_dir=directory,
    )
    for setting in ("TWINWATCH_MODELS_DIR", "TWINWATCH_DEFAULT_MODEL", "TWINWATCH_STALE_PERIODS"):
        server.env.pop(setting)
    (directory / "models").mkdir(exist_ok=True)
    (directory / "data").mkdir(exist_ok=True)
    return server


def restarted(server: ServeProcess, *, timeout_s: float = 120) -> httpx.Client:
    """The server SIGKILLed and started again on its database; a client of it."""
    server.kill()
    server.start()
    return httpx.Client(base_url=server.base_url, timeout=timeout_s)


def try_switch(server: ServeProcess, stream: str, choice: dict[str, object]) -> None:
    """A promotion whose answer may never come (the server is killed meanwhile)."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{server.base_url}/v1/streams/{stream}/model", json=choice, timeout=30)


@pytest.fixture(scope="session")
def calibrated_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models directory holding a copy of the default LSTM with lab-calibrated thresholds."""
    models = tmp_path_factory.mktemp("models")
    calibrated_lab_model(models, DEFAULT_MODEL)
    return models


@pytest.fixture
def databases(tmp_path: Path) -> Iterator[ExitStack]:
    """An exit stack that `empty_database` contexts join, so every schema is dropped at the end."""
    with ExitStack() as stack:
        yield stack


def new_database(stack: ExitStack, backend: str, directory: Path) -> str:
    """A fresh empty database (a SQLite file, or a new PostgreSQL schema) for one server."""
    return stack.enter_context(empty_database(backend, directory))


ServerFactory = Callable[[str, str], ServeProcess]


@pytest.fixture
def make_server(
    calibrated_models: Path, tmp_path: Path, databases: ExitStack
) -> Iterator[ServerFactory]:
    """`make_server(name, database_url)`: a server (not started) killed at the end of the test,
    before its database is dropped."""
    servers: list[ServeProcess] = []

    def make(name: str, database_url: str) -> ServeProcess:
        server = ServeProcess(
            name, database_url=database_url, models_dir=calibrated_models, log_dir=tmp_path
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()
