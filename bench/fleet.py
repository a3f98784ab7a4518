"""A server with a fleet of streams: its resident memory, a /metrics scrape (time and size), a
page of GET /v1/streams, and what the database stores per reading.

    .venv/bin/python bench/fleet.py [--streams 100000] [--rounds 3] [--per-stream alarms]
        [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

The streams are written straight into the database (as a server restarted with them would find
them), then a real `twinwatch serve` starts on them; every stream gets `--rounds` readings in
gateway ticks of 10,000 streams (one reading each, a noisy value, `?results=false`); then the
server is killed and started again. The bytes
are the readings table's with its indexes (PostgreSQL: `pg_total_relation_size`; SQLite: its
pages), as written and after a full vacuum. The database given is emptied first (its tables
dropped): never point it at one you need.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import insert, text

from app.storage.db import Database
from app.storage.models import Base, Stream

MODEL = "lstm-stateful-day-seed3"
TICK = 10_000


def stream_rows(ids: list[str], now: datetime) -> list[dict[str, object]]:
    """`streams` rows of the shipped stateful model, as a PUT would make them."""
    return [
        {
            "id": stream_id,
            "model_name": MODEL,
            "channels": ["value"],
            "sample_period_s": 0.1,
            "has_reference": False,
            "detector_overrides": {},
            "learning": None,
            "false_alarms_per_day": 1.0,
            "created_at": now,
            "updated_at": now,
            "last_t": None,
            "sample_count": 0,
        }
        for stream_id in ids
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(url: str, data_dir: Path, per_stream: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "TWINWATCH_DATABASE_URL": url,
        "TWINWATCH_DATA_DIR": str(data_dir),
        "TWINWATCH_PORT": str(port),
        "TWINWATCH_METRICS_PER_STREAM": per_stream,
        "TWINWATCH_STALE_PERIODS": "0",
        "TWINWATCH_LOG_LEVEL": "info",
    }
    command = [sys.executable, "-c", "from app.cli import main; main()", "serve"]
    log = (data_dir / "server.log").open("ab")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        time.sleep(0.5)
    raise SystemExit("the server did not become ready in 30 minutes")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=600)


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stored_bytes(database: Database, *, compact: bool) -> int:
    """The readings table with its indexes (and TOAST). `compact`: after a full vacuum, which
    returns the space of the rows packing replaced (autovacuum makes it reusable in time; the
    file keeps its size until then)."""
    with database.engine.connect() as connection:
        if database.dialect == "sqlite":
            if compact:
                connection.exec_driver_sql("VACUUM")
            size = connection.exec_driver_sql(
                "SELECT SUM(pgsize) FROM dbstat WHERE name = 'reading_batches' "
                "OR name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'reading_batches')"
            )
            return int(size.scalar_one() or 0)
        if compact:
            connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM FULL reading_batches"
            )
        size = connection.exec_driver_sql("SELECT pg_total_relation_size('reading_batches')")
        return int(size.scalar_one())


def scrape(base: str) -> str:
    started = time.perf_counter()
    body = httpx.get(f"{base}/metrics", timeout=600).content
    return f"{time.perf_counter() - started:.3f} s, {len(body) / 1e6:.2f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-stream", default="alarms", choices=["none", "alarms", "all"])
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(scratch)
        sqlite_file = None if args.database_url else data_dir / "twinwatch.db"
        url = args.database_url or f"sqlite:///{sqlite_file}"
        database = Database(url)
        Base.metadata.drop_all(database.engine)
        with database.engine.begin() as connection:
            connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
        process, base = serve(url, data_dir, args.per_stream)  # migrates, registers the models
        idle = resident_mib(process.pid)
        stop(process)
        (data_dir / "server.log").unlink()

        now = datetime.now(UTC)
        ids = [f"fleet-{i:06d}" for i in range(args.streams)]
        rows = stream_rows(ids, now)
        with database.session() as session:
            for start in range(0, len(rows), 10_000):
                session.execute(insert(Stream), rows[start : start + 10_000])

        started = time.perf_counter()
        process, base = serve(url, data_dir, args.per_stream)
        print(
            f"{args.streams:,} streams, {args.per_stream!r} per-stream metrics, {database.dialect}"
        )
        print(f"start-up with them: ready in {time.perf_counter() - started:.1f} s")
        print(
            f"resident memory: idle server without streams {idle:.0f} MiB, "
            f"with the streams restored {resident_mib(process.pid):.0f} MiB"
        )
        print(f"/metrics scrape: {scrape(base)}")
        try:
            with httpx.Client(base_url=base, timeout=600) as client:
                t0 = 1_767_225_600.0
                noise = np.random.default_rng(0)
                started = time.perf_counter()
                for round_ in range(args.rounds):
                    for start in range(0, len(ids), TICK):
                        tick = {
                            "streams": [
                                {"stream": s, "readings": [{"t": t0 + 0.1 * round_, "value": v}]}
                                for s, v in zip(
                                    ids[start : start + TICK],
                                    noise.normal(0, 1, TICK).round(4).tolist(),
                                    strict=False,
                                )
                            ]
                        }
                        answer = client.post("/v1/readings?results=false", json=tick)
                        answer.raise_for_status()
                readings = args.rounds * len(ids)
                took = time.perf_counter() - started
                print(f"{readings:,} readings in ticks of {TICK:,} streams: {took:.1f} s")
                print(f"resident memory, every stream live: {resident_mib(process.pid):.0f} MiB")
                print(f"/metrics scrape, every stream live: {scrape(base)}")
                started = time.perf_counter()
                page = client.get("/v1/streams", params={"limit": 100})
                print(
                    f"GET /v1/streams (a page of 100): {time.perf_counter() - started:.3f} s, "
                    f"{len(page.content) / 1e3:.0f} kB"
                )
            process.kill()  # every stream now has readings after its checkpoint to replay
            process.wait()
            started = time.perf_counter()
            process, base = serve(url, data_dir, args.per_stream)
            print(
                f"restart after a SIGKILL (each stream replays what followed its checkpoint): "
                f"ready in {time.perf_counter() - started:.1f} s"
            )
        finally:
            stop(process)
        for compact in (False, True):
            stored = stored_bytes(database, compact=compact)
            print(
                f"readings table {'after a full vacuum' if compact else 'as written'}: "
                f"{stored / readings:.1f} bytes a reading, "
                f"{stored / readings * 1e6 / 2**20:.1f} MiB per million readings"
            )
        database.dispose()


if __name__ == "__main__":
    main()
