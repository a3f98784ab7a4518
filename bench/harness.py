"""Benchmark plumbing: a calibrated model copy, fresh databases, server processes, a lean client.

The client is a minimal HTTP/1.1 keep-alive client on asyncio streams rather than httpx: on a
2-core machine the client shares the CPU with the server, and httpx costs several times more
per request than the few dozen lines below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.forecasting.artifacts import save_model
from app.forecasting.stateful_lstm import STATEFUL_TRAINING, StatefulLSTMForecaster
from app.monitoring.workflow import calibrate
from app.registry import SHIPPED_MODELS_DIR
from app.series import read_csv

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "lstm-seed0"
LAB_DATA = ROOT / "tests" / "data" / "twin_seed0_lab_faults.csv"
LAB_HOLDOUT = "6000:7000"
TRAIN_DATA = ROOT / "tests" / "data" / "twin_seed0.csv"
TRAIN_END = 6000
SHIPPED_STATEFUL = "lstm-stateful-day-seed3"  # used when another engineer has shipped it
BENCH_STATEFUL = "lstm-stateful-bench"  # else trained here for a few epochs
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def calibrated_models(directory: Path) -> Path:
    """`directory/models` holding a copy of the default LSTM calibrated on the lab hold-out."""
    models = directory / "models"
    copy = models / DEFAULT_MODEL
    shutil.copytree(SHIPPED_MODELS_DIR / DEFAULT_MODEL, copy)
    calibrate(copy, LAB_DATA, LAB_HOLDOUT)
    return models


def fit_stateful(epochs: int = 2) -> StatefulLSTMForecaster:
    """A stateful LSTM fitted for a few epochs on the twin's first 6,000 samples: throughput
    and memory do not depend on how well it forecasts, only on its architecture."""
    matrix = read_csv(TRAIN_DATA).matrix(["value"])
    training = dataclasses.replace(STATEFUL_TRAINING, epochs=epochs, patience=None)
    return StatefulLSTMForecaster(training=training).fit(matrix, train_end=TRAIN_END)


def stateful_model(models: Path, *, epochs: int = 2) -> tuple[str, str]:
    """Put a calibrated `lstm-stateful` model into `models`; returns (name, provenance).

    The shipped lstm-stateful-day-seed3 when it exists (copied; calibrated on the lab hold-out if
    its manifest has no thresholds), else a model fitted here for `epochs` epochs (seconds) and
    calibrated on the lab hold-out, like `calibrated_models` does for the window LSTM.
    """
    models.mkdir(parents=True, exist_ok=True)
    shipped = SHIPPED_MODELS_DIR / SHIPPED_STATEFUL
    if (shipped / "manifest.json").is_file():
        target = models / SHIPPED_STATEFUL
        if not target.exists():
            shutil.copytree(shipped, target)
            if "thresholds" not in json.loads((target / "manifest.json").read_text()):
                calibrate(target, LAB_DATA, LAB_HOLDOUT)
        return SHIPPED_STATEFUL, f"app/shipped_models/{SHIPPED_STATEFUL}"
    target = models / BENCH_STATEFUL
    if not target.exists():
        series = read_csv(TRAIN_DATA)
        extra = {
            "channels": ["value"],
            "training": {
                "data": str(TRAIN_DATA),
                "data_sha256": series.sha256(),
                "train_end": TRAIN_END,
            },
        }
        save_model(fit_stateful(epochs), target, extra=extra)
        calibrate(target, LAB_DATA, LAB_HOLDOUT)
    return BENCH_STATEFUL, f"fitted here: {epochs} epochs on {TRAIN_DATA.name}[:{TRAIN_END}]"


def machine_info() -> dict[str, object]:
    """What the figures were measured on (no git: the benchmarks must not touch the repository)."""
    import platform

    import torch

    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(int(memory) / 2**20, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def vm_rss_mb(pid: int) -> float:
    """Resident memory of a process (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextmanager
def postgres_schema(base_url: str) -> Iterator[str]:
    """A new schema on the server of `base_url` and a URL whose connections use it; dropped
    afterwards (the `options=-csearch_path=...` trick of tests/integration/conftest.py)."""
    name = f"tw_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE SCHEMA "{name}"'))
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={name}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A server subprocess on a loopback port, logging to a file."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str],
        log: Path,
        *,
        cwd: Path = ROOT,
        port_option: str = "--port",
    ) -> None:
        self.name = name
        self.cwd = cwd
        self.port = free_port()
        self.command = [*command, port_option, str(self.port)]
        self.env = env
        self.log_path = log
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def launch(self) -> None:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command, env=self.env, cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, path: str, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                status, _ = asyncio.run(_get_once(self.port, path))
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process so far (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def twinwatch_server(
    name: str,
    *,
    database_url: str,
    models_dir: Path,
    work: Path,
    log_level: str,
    default_model: str = DEFAULT_MODEL,
) -> Server:
    """`twinwatch serve`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
    env |= {
        "TWINWATCH_DATABASE_URL": database_url,
        "TWINWATCH_MODELS_DIR": str(models_dir),
        "TWINWATCH_DEFAULT_MODEL": default_model,
        "TWINWATCH_DATA_DIR": str(work / f"{name}-data"),
        "TWINWATCH_MIGRATE_ON_START": "true",
        "TWINWATCH_LOG_LEVEL": log_level,
    }
    command = [sys.executable, "-c", "from app.cli import main; main()", "serve"]
    return Server(name, command, env, work / f"{name}.log")


def parse_only_server(
    name: str,
    *,
    work: Path,
    log_level: str,
    models_dir: Path | None = None,
    default_model: str = DEFAULT_MODEL,
    bare: bool = False,
) -> Server:
    """bench/parse_only.py: the real app (its own SQLite file, `models_dir` loaded as the
    service would) plus the parse-only routes; `bare` for the old stand-alone FastAPI app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env |= {
        "TWINWATCH_DATABASE_URL": f"sqlite:///{(work / f'{name}.db').as_posix()}",
        "TWINWATCH_MODELS_DIR": str(models_dir or work / f"{name}-no-models"),
        "TWINWATCH_DEFAULT_MODEL": default_model,
        "TWINWATCH_DATA_DIR": str(work / f"{name}-data"),
        "TWINWATCH_MIGRATE_ON_START": "true",
        "TWINWATCH_LOG_LEVEL": log_level,
    }
    command = [sys.executable, str(ROOT / "bench" / "parse_only.py"), "--log-level", log_level]
    if bare:
        command.append("--bare")
    return Server(name, command, env, work / f"{name}.log")


# --- the client ---------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection; responses must carry Content-Length (FastAPI's do)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self._writer is None:
            await self.open()
        assert self._reader is not None and self._writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode("ascii") + body)
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self._reader.readexactly(length)


async def _get_once(port: int, path: str) -> tuple[int, bytes]:
    connection = Connection(port)
    try:
        return await connection.request("GET", path)
    finally:
        await connection.close()


# --- payloads -----------------------------------------------------------------------------------

T0_EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z


def timestamp(sample: int) -> str:
    """RFC 3339 UTC for a 10 Hz stream, as a client would send it."""
    seconds, millis = divmod(T0_EPOCH_MS + 100 * sample, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def readings_body(values: np.ndarray, first_sample: int) -> bytes:
    """A `POST .../readings` body for `values` at samples first_sample, first_sample + 1, ..."""
    items = ",".join(
        f'{{"t":"{timestamp(first_sample + i)}","value":{float(v)!r}}}'
        for i, v in enumerate(values)
    )
    return f'{{"readings":[{items}]}}'.encode()
