"""A fleet's stop and start: how long a graceful stop (SIGTERM) takes once every stream has moved,
how soon a start answers /healthz, /readyz and a reading, its resident memory, and the same
after a SIGKILL.

    .venv/bin/python bench/lifecycle.py [--streams 100000] [--rounds 2]
        [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

The streams (the shipped stateful model, a reading a minute) are written straight into the
database, a real `twinwatch serve` starts on them, and every stream gets `--rounds` readings in
gateway ticks of 10,000 streams, so that every stream has moved since its last checkpoint when
the server is stopped: the stop writes them all. The database given is emptied first (its
tables dropped): never point it at one you need.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import TICK, free_port, resident_mib, stream_rows  # (a script beside this one)

from app.storage.db import Database
from app.storage.models import Base, Stream

PERIOD_S = 60.0
T0 = 1_767_225_600.0


class Server:
    """A `twinwatch serve` and when it answered what."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "TWINWATCH_DATABASE_URL": url,
            "TWINWATCH_DATA_DIR": str(data_dir),
            "TWINWATCH_PORT": str(self.port),
            "TWINWATCH_STALE_PERIODS": "0",
            "TWINWATCH_LOG_LEVEL": "info",
        }
        command = [sys.executable, "-c", "from app.cli import main; main()", "serve"]
        log = (data_dir / "server.log").open("ab")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log)

    def wait_for(self, path: str, *, method: str = "GET", body: object = None) -> float:
        """Seconds from the start until `path` answered 2xx."""
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            try:
                answer = httpx.request(method, self.base + path, json=body, timeout=30)
                if answer.is_success:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}")
            time.sleep(0.1)
        raise SystemExit(f"{path} did not answer in 30 minutes")

    def stop(self) -> float:
        """Seconds a graceful stop took."""
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=1800)
        return time.perf_counter() - started

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def start(url: str, data_dir: Path, probe: str, moment: float) -> tuple[Server, str]:
    server = Server(url, data_dir)
    healthy = server.wait_for("/healthz")
    reading = {"readings": [{"t": moment, "value": 0.5}]}
    answered = server.wait_for(f"/v1/streams/{probe}/readings", method="POST", body=reading)
    ready = server.wait_for("/readyz")
    while True:  # the restore behind the open port, to its end
        streams = httpx.get(f"{server.base}/readyz", timeout=30).json()["checks"]["streams"]
        if not streams.startswith("restoring"):
            break
        time.sleep(0.1)
    restored = time.perf_counter() - server.started
    line = (
        f"/healthz {healthy:.1f} s, a reading answered {answered:.1f} s, /readyz {ready:.1f} s, "
        f"every stream restored {restored:.1f} s ({streams}); "
        f"resident {resident_mib(server.process.pid):.0f} MiB"
    )
    return server, line


def onboard(base: str, count: int) -> float:
    """Seconds to create `count` streams of model auto with `PUT /v1/streams`, 100,000 a
    request."""
    ids = [f"new-{i:06d}" for i in range(count)]
    started = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as client:
        for first in range(0, count, 100_000):
            body = {"streams": [{"id": i, "model": "auto"} for i in ids[first : first + 100_000]]}
            client.put("/v1/streams", json=body).raise_for_status()
    return time.perf_counter() - started


def feed(
    base: str, ids: list[str], rounds: int, first_round: int, acknowledged: list[int] | None = None
) -> float:
    """Every stream `rounds` readings, in ticks; `acknowledged` counts the readings answered
    2xx (feeding stops at the first request that fails: the server was killed)."""
    noise = np.random.default_rng(first_round)
    started = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as client:
        for round_ in range(first_round, first_round + rounds):
            for first in range(0, len(ids), TICK):
                chunk = ids[first : first + TICK]
                values = noise.normal(0, 1, len(chunk)).round(4).tolist()
                tick = {
                    "streams": [
                        {"stream": s, "readings": [{"t": T0 + PERIOD_S * round_, "value": v}]}
                        for s, v in zip(chunk, values, strict=True)
                    ]
                }
                try:
                    client.post("/v1/readings?results=false", json=tick).raise_for_status()
                except httpx.HTTPError:
                    if acknowledged is None:
                        raise
                    return time.perf_counter() - started
                if acknowledged is not None:
                    acknowledged.append(len(chunk))
    return time.perf_counter() - started


def stored_readings(database: Database) -> int:
    with database.engine.connect() as connection:
        total = connection.execute(text("SELECT COALESCE(SUM(count), 0) FROM reading_batches"))
        return int(total.scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(scratch)
        url = args.database_url or f"sqlite:///{data_dir / 'twinwatch.db'}"
        database = Database(url)
        Base.metadata.drop_all(database.engine)
        with database.engine.begin() as connection:
            connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
        empty = Server(url, data_dir)  # migrates, registers the models
        empty.wait_for("/readyz")
        idle = resident_mib(empty.process.pid)
        empty.stop()

        ids = [f"fleet-{i:06d}" for i in range(args.streams)]
        rows = stream_rows(ids, datetime.now(UTC))
        for row in rows:
            row["sample_period_s"] = PERIOD_S
        with database.session() as session:
            for first in range(0, len(rows), 10_000):
                session.execute(insert(Stream), rows[first : first + 10_000])
        print(
            f"{args.streams:,} streams of {PERIOD_S:g} s, {database.dialect}; {idle:.0f} MiB idle"
        )

        round_ = 0
        server, line = start(url, data_dir, ids[0], T0 - 1)
        print(f"first start: {line}")
        for _ in range(2):
            took = feed(server.base, ids, args.rounds, round_)
            round_ += args.rounds
            print(
                f"  {args.rounds * len(ids):,} readings in {took:.1f} s; resident "
                f"{resident_mib(server.process.pid):.0f} MiB"
            )
            print(f"graceful stop (SIGTERM), every stream moved: {server.stop():.1f} s")
            server, line = start(url, data_dir, ids[-1], T0 + PERIOD_S * round_ - 1)
            print(f"start: {line}")
        # Under load: ticks going in when the server is killed.
        before, acknowledged = stored_readings(database), []
        feeding = threading.Thread(
            target=feed, args=(server.base, ids, args.rounds, round_, acknowledged)
        )
        feeding.start()
        while sum(acknowledged) < len(ids) // 2:
            time.sleep(0.01)
        server.kill()
        feeding.join()
        round_ += args.rounds
        print(f"SIGKILL while ticks went in ({sum(acknowledged):,} readings acknowledged)")
        server, line = start(url, data_dir, ids[-1], T0 + PERIOD_S * round_ - 1)
        print(f"start: {line}")
        kept = stored_readings(database) - before - 1  # (the start's own probe reading)
        verdict = "nothing lost" if kept >= sum(acknowledged) else "READINGS LOST"
        print(f"  stored: {kept:,} of the {sum(acknowledged):,} acknowledged: {verdict}")
        took = onboard(server.base, args.streams)
        print(f"onboarding {args.streams:,} more streams (PUT /v1/streams): {took:.1f} s")
        server.stop()
        database.dispose()


if __name__ == "__main__":
    main()
