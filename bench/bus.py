"""One `twinwatch worker` draining the bus: readings per second it commits, and the bytes a
reading takes on the bus (JetStream's own count) and in PostgreSQL.

    .venv/bin/python bench/bus.py [--streams 1000] [--rounds 10] [--batch 10]
        [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

A `nats-server -js` of its own (Debian's package) on a free port; a fresh schema in the
database given (dropped at the end). Every stream (the shipped stateful LSTM, as in
bench/fleet.py) gets `--rounds` batches of `--batch` readings at 10 Hz, all published first
(as `?wait=false` would), then one worker starts and drains them: the time from its first
commit to its last gives readings per second for one worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import free_port, stored_bytes, stream_rows  # (a script beside this one)

from app.bus.jetstream import STREAM, open_bus
from app.bus.publisher import Batch, store_all
from app.storage import migrations
from app.storage.db import Database
from app.storage.models import Stream

PARTITIONS = 64
COMMITTED = text("SELECT coalesce(sum(count), 0) FROM reading_batches")


def start_nats(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit("nats-server is not installed (apt-get install nats-server)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(directory / "nats")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    return process, f"nats://127.0.0.1:{port}"


def batches(ids: list[str], rounds: int, size: int, t0: float) -> list[list[Batch]]:
    rng = np.random.default_rng(0)
    out = []
    for round_ in range(rounds):
        first = round_ * size
        times = t0 + (first + np.arange(size)) * 0.1
        micros = np.round(times * 1e6).astype(np.int64)
        items = []
        for stream in ids:
            values = np.sin((first + np.arange(size)) * 0.05) + rng.normal(0, 0.05, size)
            readings = ",".join(
                f'{{"t":{t!r},"value":{v!r}}}'
                for t, v in zip(times.tolist(), values.tolist(), strict=True)
            )
            body = f'{{"stream":"{stream}","readings":[{readings}]}}'.encode()
            items.append(Batch(stream, body, micros))
        out.append(items)
    return out


async def publish(url: str, rounds: list[list[Batch]]) -> tuple[int, int]:
    """Everything stored on the bus; JetStream's bytes and messages then."""
    bus = await open_bus(url, name="bench", partitions=PARTITIONS, lease_s=5.0)
    try:
        for items in rounds:
            await store_all(bus, items)
        info = await bus.jetstream.stream_info(STREAM)
        return int(info.state.bytes), int(info.state.messages)
    finally:
        await bus.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "TWINWATCH_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    schema = f"bench_bus_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = (
        make_url(args.database_url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    nats = worker = None
    try:
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            migrations.upgrade(url)
            nats, bus_url = start_nats(directory)
            ids = [f"bus-{i:06d}" for i in range(args.streams)]
            env = {
                **os.environ,
                "TWINWATCH_DATABASE_URL": url,
                "TWINWATCH_DATA_DIR": str(directory / "data"),
                "TWINWATCH_BUS_URL": bus_url,
                "TWINWATCH_BUS_PARTITIONS": str(PARTITIONS),
                "TWINWATCH_STALE_PERIODS": "0",
                "TWINWATCH_LOG_LEVEL": "warning",
            }
            # The worker registers the shipped models; the streams are written straight in.
            command = [sys.executable, "-c", "from app.cli import main; main()", "worker"]
            worker = subprocess.Popen([*command, "--metrics-port", "0"], env=env)
            database = Database(url)
            deadline = time.monotonic() + 300
            while True:
                with database.engine.connect() as connection:
                    if connection.execute(text("SELECT count(*) FROM models")).scalar_one():
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not start")
                time.sleep(0.5)
            worker.terminate()
            worker.wait(timeout=120)
            with database.session() as session:
                session.execute(insert(Stream), stream_rows(ids, datetime.now(UTC)))
            rounds = batches(ids, args.rounds, args.batch, time.time() - 3600)
            body_bytes = sum(len(b.body) for items in rounds for b in items)
            on_bus, messages = asyncio.run(publish(bus_url, rounds))
            total = args.streams * args.rounds * args.batch

            worker = subprocess.Popen([*command, "--metrics-port", "0"], env=env)
            started = None
            while True:
                with database.session() as session:
                    done = session.execute(COMMITTED).scalar_one()
                if done and started is None:
                    started = (time.monotonic(), int(done))
                if done >= total:
                    break
                time.sleep(0.2)
            assert started is not None
            seconds = time.monotonic() - started[0]
            rate = (total - started[1]) / seconds
            in_database = stored_bytes(database, compact=False)
            database.dispose()
            print(
                f"{args.streams:,} streams x {args.rounds} batches of {args.batch} readings "
                f"({total:,} readings, {messages:,} messages), one worker:"
            )
            print(f"  committed      {rate:10,.0f} readings/s ({rate / args.batch:,.0f} batches/s)")
            print(
                f"  on the bus          {on_bus / total:10,.1f} bytes a reading "
                f"({body_bytes / total:,.1f} of them the JSON body)"
            )
            print(
                f"  in PostgreSQL       {in_database / total:10,.1f} bytes a reading (as written)"
            )
    finally:
        for process in (worker, nats):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=120)
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


if __name__ == "__main__":
    main()
