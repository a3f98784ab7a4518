"""Processes and probes of the bus tests (tests/e2e/test_bus_*.py): `twinwatch worker`
processes, who holds which partition, and the lab record as readings to post."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from nats.js.errors import KeyNotFoundError, NoKeysError

from app.bus.jetstream import LEASES_BUCKET, open_bus

ROOT = Path(__file__).resolve().parents[2]
WORKER = (sys.executable, "-c", "from app.cli import main; main()", "worker")
PARTITIONS = 8
LEASE_S = 3.0


class WorkerProcess:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log: IO[bytes] = (log_dir / f"{name}.log").open("wb")
        self.process = subprocess.Popen(
            [*WORKER, "--name", name, "--metrics-port", "0"],
            env=env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def end(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(timeout=60)
        self.log.close()


async def holders(url: str) -> dict[int, str]:
    bus = await open_bus(url, name="probe", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        kv = await bus.jetstream.key_value(LEASES_BUCKET)
        held: dict[int, str] = {}
        try:
            keys = await kv.keys()
        except NoKeysError:
            return held
        for key in keys:
            if key.startswith("p."):
                try:
                    entry = await kv.get(key)
                except KeyNotFoundError:
                    continue  # expired, or given back, since it was listed
                held[int(key[2:])] = (entry.value or b"").decode()
        return held
    finally:
        await bus.close()


async def until_held(url: str, test: Callable[[dict[int, str]], bool], limit_s: float) -> float:
    started = time.monotonic()
    while True:
        held = await holders(url)
        if test(held):
            return time.monotonic() - started
        assert time.monotonic() - started < limit_s, held
        await asyncio.sleep(0.2)


def worker_env(database_url: str, nats_url: str, models: Path, data: Path) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")} | {
        "TWINWATCH_DATABASE_URL": database_url,
        "TWINWATCH_MODELS_DIR": str(models),
        "TWINWATCH_DATA_DIR": str(data),
        "TWINWATCH_BUS_URL": nats_url,
        "TWINWATCH_BUS_PARTITIONS": str(PARTITIONS),
        "TWINWATCH_BUS_LEASE_S": str(LEASE_S),
        "TWINWATCH_STALE_PERIODS": "0",
        "TWINWATCH_LOG_LEVEL": "info",
    }
