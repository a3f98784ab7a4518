"""`twinwatch serve` and `twinwatch worker` processes on a NATS server with JetStream (a test's
own `nats-server`) and PostgreSQL:

- on the bus, `serve` answers a POST of readings byte for byte as the embedded service does
  (the lab record, its alarms), before and after a change of the stream's detectors, which
  its worker makes; a model switch and a deletion are made there too; `?wait=false` answers
  202 once the bus holds the batch; with no worker, a POST answers 503 (Retry-After, safe to
  re-send) and its batch is committed once a worker comes;
- a worker SIGKILLed while readings pour in loses nothing and doubles nothing, and the survivor
  has taken its partitions over within 10 s."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np

from app.bus.jetstream import open_bus
from app.bus.publisher import NotAnsweredError, submit
from app.storage.db import Database
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import readings as reading_repo
from tests.e2e.conftest import ServerFactory, new_database
from tests.support.bus import (
    LEASE_S,
    PARTITIONS,
    WorkerProcess,
    until_held,
    worker_env,
)
from tests.support.models import epoch_times, lab_readings, lab_series
from tests.support.nats import NatsServer, nats_server

STREAMS = [f"pump-{index}" for index in range(8)]
BATCH = 50
BATCHES = 40  # 2,000 readings a stream
TAKEOVER_LIMIT_S = 10.0


def body_of(stream: str, first: int) -> tuple[bytes, np.ndarray]:
    times = epoch_times(first, first + BATCH)
    values = lab_series().value[first : first + BATCH]
    readings = [{"t": float(t), "value": float(v)} for t, v in zip(times, values, strict=True)]
    micros = np.array([round(t * 1e6) for t in times], dtype=np.int64)
    return json.dumps({"stream": stream, "readings": readings}).encode(), micros


async def pour(url: str, kill: WorkerProcess, survivor: str) -> float:
    """Every stream's batches, in order per stream, the streams side by side; the first worker
    SIGKILLed halfway. How long the survivor took to hold every partition."""
    api = await open_bus(url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    killed = asyncio.Event()
    takeover: list[float] = []

    async def stream_batches(stream: str) -> None:
        for index in range(BATCHES):
            if index == BATCHES // 2 and not killed.is_set():
                killed.set()
                kill.end(signal.SIGKILL)
                takeover.append(
                    await until_held(
                        url,
                        lambda held: len(held) == PARTITIONS and set(held.values()) == {survivor},
                        TAKEOVER_LIMIT_S + LEASE_S,
                    )
                )
            body, times = body_of(stream, index * BATCH)
            try:
                answer = await submit(api, stream, body, times, with_results=False, wait_s=30)
            except NotAnsweredError:
                continue  # stored on the bus: committed once, whoever commits it
            assert answer.status == 200, answer.body

    try:
        await asyncio.gather(*(stream_batches(stream) for stream in STREAMS))
    finally:
        await api.close()
    return takeover[0]


def timeless(stream: dict[str, object]) -> dict[str, object]:
    """A stream's description without the times it was created and updated at."""
    return {key: value for key, value in stream.items() if not key.endswith("_at")}


def test_on_the_bus_serve_answers_as_the_embedded_service(
    make_server: ServerFactory, databases: ExitStack, tmp_path: Path, calibrated_models: Path
) -> None:
    embedded = make_server("embedded", new_database(databases, "postgresql", tmp_path))
    embedded.env["TWINWATCH_METRICS_PER_STREAM"] = "all"
    embedded.start()
    alone = httpx.Client(base_url=embedded.base_url, timeout=120)
    with ExitStack() as stack:
        nats: NatsServer = stack.enter_context(nats_server(tmp_path))
        database_url = new_database(databases, "postgresql", tmp_path)
        env = worker_env(database_url, nats.url, calibrated_models, tmp_path / "worker-data")
        api = make_server("on-the-bus", database_url)
        api.env |= {key: env[key] for key in env if key.startswith("TWINWATCH_BUS_")}
        api.env["TWINWATCH_BUS_WAIT_S"] = "3"
        api.env["TWINWATCH_METRICS_PER_STREAM"] = "all"
        api.start()
        bus = httpx.Client(base_url=api.base_url, timeout=120)
        worker = WorkerProcess("worker", env, tmp_path)
        stack.callback(lambda: worker.end(signal.SIGKILL))
        asyncio.run(until_held(nats.url, lambda held: len(held) == PARTITIONS, 90))

        for client in (alone, bus):
            assert client.put("/v1/streams/pump-1", json={}).status_code == 201
        change = {"detectors": {"point": {"threshold": 4.5}}}
        for first in range(0, 8000, 500):
            if first == 4000:
                # A change goes through the stream's partition to its worker, which makes it
                # as the embedded service does: the readings after it are answered alike.
                expected = alone.put("/v1/streams/pump-1", json=change)
                changed = bus.put("/v1/streams/pump-1", json=change)
                assert changed.status_code == expected.status_code == 200, changed.text
                assert timeless(changed.json()) == timeless(expected.json())
            expected = alone.post(
                "/v1/streams/pump-1/readings", json=lab_readings(first, first + 500)
            )
            answer = bus.post("/v1/streams/pump-1/readings", json=lab_readings(first, first + 500))
            assert (answer.status_code, answer.content) == (expected.status_code, expected.content)
        assert len(bus.get("/v1/alarms", params={"limit": 1000}).json()["items"]) == len(
            alone.get("/v1/alarms", params={"limit": 1000}).json()["items"]
        )
        missing = bus.post("/v1/streams/nobody/readings", json=lab_readings(0, 3))
        expected = alone.post("/v1/streams/nobody/readings", json=lab_readings(0, 3))
        assert (missing.status_code, missing.content) == (404, expected.content)
        assert missing.headers["content-type"] == "application/problem+json"
        described = bus.get("/v1/streams/pump-1").json()
        assert described["samples_seen"] == 8000
        # The stream's series are its worker's: the API process exports none at zero beside.
        assert 'stream="pump-1"' in alone.get("/metrics").text
        assert 'stream="pump-1"' not in bus.get("/metrics").text
        # A switch is the worker's too: refused there as the embedded service refuses it.
        switch = {"name": "lstm-seed0", "version": 1}
        switched = bus.post("/v1/streams/pump-1/model", json=switch)
        expected = alone.post("/v1/streams/pump-1/model", json=switch)
        assert (switched.status_code, switched.json()) == (expected.status_code, expected.json())
        assert switched.status_code == 409 and "already" in switched.json()["detail"]

        # Not waiting: stored on the bus, committed by the worker.
        stored = bus.post("/v1/streams/pump-1/readings?wait=false", json=lab_readings(8000, 8100))
        assert stored.status_code == 202 and stored.json() == {"stored": 1}
        deadline = time.monotonic() + 30
        while bus.get("/v1/streams/pump-1").json()["samples_seen"] != 8100:
            assert time.monotonic() < deadline, "the stored batch was not committed"
            time.sleep(0.2)

        # No worker: 503, safe to re-send; the batch is committed once a worker comes. (Its
        # clean stop checkpointed the stream: the next one replays nothing.)
        worker.end(signal.SIGTERM)
        database = Database(database_url)
        try:
            with database.session() as session:
                checkpoint = checkpoint_repo.get(session, "pump-1")
                assert checkpoint is not None and checkpoint.sample_count == 8100
        finally:
            database.dispose()
        waiting = bus.post("/v1/streams/pump-1/readings", json=lab_readings(8100, 8200))
        assert waiting.status_code == 503 and waiting.headers["retry-after"]
        assert "safe" in waiting.json()["detail"]
        # More POSTs waiting than the API has request threads (40): the probes answer all the
        # same, while every one of them still waits.
        limits = httpx.Limits(max_connections=80)
        with (
            httpx.Client(base_url=api.base_url, timeout=120, limits=limits) as many,
            ThreadPoolExecutor(60) as pool,
        ):
            body = lab_readings(8100, 8200)
            pending = [
                pool.submit(many.post, "/v1/streams/pump-1/readings", json=body) for _ in range(60)
            ]
            time.sleep(1.0)
            probes = [many.get(path) for path in ("/healthz", "/readyz")]
            assert not any(post.done() for post in pending)
            assert [probe.status_code for probe in probes] == [200, 200]
            assert {post.result().status_code for post in pending} == {503}
        worker = WorkerProcess("worker-again", env, tmp_path)
        asyncio.run(
            until_held(
                nats.url,
                lambda held: len(held) == PARTITIONS and set(held.values()) == {"worker-again"},
                90,
            )
        )
        again = bus.post("/v1/streams/pump-1/readings", json=lab_readings(8100, 8200))
        assert again.status_code == 200, again.text
        assert (again.json()["accepted"], again.json()["duplicates"]) == (0, 100)
        assert bus.get("/v1/streams/pump-1").json()["samples_seen"] == 8200
        # Deleted through its worker: gone, and its readings refused as of an unknown stream.
        assert bus.delete("/v1/streams/pump-1").status_code == 204
        assert bus.get("/v1/streams/pump-1").status_code == 404
        gone = bus.post("/v1/streams/pump-1/readings", json=lab_readings(8200, 8210))
        assert gone.status_code == 404, gone.text
    api.stop()
    embedded.stop()


def test_a_killed_worker_loses_nothing_and_its_partitions_move(
    make_server: ServerFactory, databases: ExitStack, tmp_path: Path, calibrated_models: Path
) -> None:
    database_url = new_database(databases, "postgresql", tmp_path)
    server = make_server("config", database_url)
    server.start()  # migrates, registers the models; the streams are configured through it
    api = httpx.Client(base_url=server.base_url, timeout=60)
    for stream in STREAMS:
        assert api.put(f"/v1/streams/{stream}", json={}).status_code == 201
    server.stop()

    with ExitStack() as stack:
        nats: NatsServer = stack.enter_context(nats_server(tmp_path))
        env = worker_env(database_url, nats.url, calibrated_models, tmp_path / "worker-data")
        first = WorkerProcess("worker-a", env, tmp_path)
        stack.callback(first.end, signal.SIGKILL)
        second = WorkerProcess("worker-b", env, tmp_path)
        stack.callback(second.end, signal.SIGTERM)
        asyncio.run(
            until_held(
                nats.url,
                lambda held: len(held) == PARTITIONS and len(set(held.values())) == 2,
                90,
            )
        )
        took = asyncio.run(pour(nats.url, first, "worker-b"))
        assert took < TAKEOVER_LIMIT_S

        # Every batch committed exactly once: the readings stored are the readings sent.
        database = Database(database_url)
        try:
            deadline = time.monotonic() + 60
            while True:
                with database.session() as session:
                    counts = {s: reading_repo.count(session, stream_id=s) for s in STREAMS}
                if all(count == BATCH * BATCHES for count in counts.values()):
                    break
                assert time.monotonic() < deadline, counts
                time.sleep(0.5)
            with database.session() as session:
                for stream in STREAMS:
                    stored = reading_repo.all_times(session, stream_id=stream)
                    expected = np.array([round(t * 1e6) for t in epoch_times(0, BATCH * BATCHES)])
                    assert np.array_equal(stored, expected), stream
        finally:
            database.dispose()
