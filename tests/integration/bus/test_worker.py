"""Workers on a real NATS server with JetStream (a test's own `nats-server`) and the test
database: a published batch is committed by the worker that leases its partition and answered
as the embedded service answers it; a re-sent batch is not processed twice; two workers share
the partitions, and one that stops beating has its partitions taken over with nothing lost; a
worker that lost its lease cannot commit for the partition (the fence)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext
from sqlalchemy import select

from app.bus.jetstream import STREAM, open_bus
from app.bus.leases import Leases
from app.bus.messages import Answer
from app.bus.partitions import partition_of
from app.bus.publisher import Batch, change, store_all, submit, submit_all
from app.bus.worker import Worker
from app.metrics import Metrics
from app.service.engine import Engine, open_engine
from app.settings import Settings
from app.storage.db import Database
from app.storage.models import Alarm
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import bus as bus_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories.bus import FencedError
from tests.integration.conftest import T0, fake_loader, make_stream, write_fake_model
from tests.support.nats import NatsServer, nats_server

PARTITIONS = 8
LEASE_S = 2.0
WAIT_S = 20.0
NEVER = {"kind": "point", "threshold": 1e9}  # a version that never alarms


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    with nats_server(tmp_path) as server:
        yield server


def batch(stream: str, first: int, count: int, *, swing: float = 0.0) -> tuple[bytes, np.ndarray]:
    """Readings `first`.. of a flat signal, every other one `swing` higher; the body and the
    readings' times (microseconds)."""
    times = [T0.timestamp() + i / 10 for i in range(first, first + count)]
    values = [swing * (i % 2) for i in range(first, first + count)]
    body = {
        "stream": stream,
        "readings": [{"t": t, "value": v} for t, v in zip(times, values, strict=True)],
    }
    micros = np.array([round(t * 1e6) for t in times], dtype=np.int64)
    return json.dumps(body).encode(), micros


def engine_for(
    database: Database, models_dir: Path, tmp_path: Path, *, stale_periods: float = 0
) -> Engine:
    settings = Settings(
        database_url=database.url,
        models_dir=models_dir,
        default_model="lstm-seed0",
        data_dir=tmp_path / "data",
        migrate_on_start=False,
        shipped_models=False,
        stale_periods=stale_periods,
        stale_min_s=0,
    )
    return open_engine(settings, Metrics(), fake_loader)


@asynccontextmanager
async def running(engine: Engine, url: str, name: str) -> AsyncIterator[Worker]:
    """A worker consuming until the block ends (a clean stop: its leases given back)."""
    bus = await open_bus(url, name=name, partitions=PARTITIONS, lease_s=LEASE_S)
    worker = Worker(engine, bus, name)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await task
        await bus.close()


async def until(condition: Any, what: str, limit_s: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


def answered(answer: Answer) -> dict[str, Any]:
    body = json.loads(answer.body)
    assert isinstance(body, dict)
    return body


@pytest.mark.anyio
async def test_a_worker_commits_and_answers_what_is_published(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    with database.session() as session:
        make_stream(session, "pump-1")
    engine = engine_for(database, models_dir, tmp_path)
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        async with running(engine, nats.url, "worker-a") as worker:
            await until(lambda: len(worker.leases.held) == PARTITIONS, "the worker took them")
            body, times = batch("pump-1", 0, 40)
            first = answered(
                await submit(api, "pump-1", body, times, with_results=True, wait_s=WAIT_S)
            )
            assert first["accepted"] == 40 and len(first["results"]) == 40
            # A swing the persistence forecast misses: the point detector's alarm, answered.
            body, times = batch("pump-1", 40, 20, swing=5.0)
            swung = answered(
                await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            )
            assert swung["results"] == []
            assert {"point", "rolling_rms"} == {a["detector"] for a in swung["opened"]}
            # The same batch again: JetStream keeps one copy of the first; this one is answered
            # as a re-send.
            resent = answered(
                await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            )
            assert (resent["accepted"], resent["duplicates"], resent["opened"]) == (0, 20, [])
            # With one more reading it is a new batch: its old readings are duplicates.
            body, times = batch("pump-1", 40, 21, swing=5.0)
            again = answered(
                await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            )
            assert (again["accepted"], again["duplicates"]) == (1, 20)
            # What the embedded service refuses, the worker answers the same way.
            body, times = batch("nobody", 0, 3)
            unknown = await submit(api, "nobody", body, times, with_results=False, wait_s=WAIT_S)
            assert unknown.status == 404 and unknown.media_type == "application/problem+json"
            body, times = batch("pump-1", 0, 3, swing=9.0)  # accepted times, other values
            late = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert late.status == 409
    finally:
        await api.close()
    with database.session() as session:
        assert reading_repo.count(session, stream_id="pump-1") == 61
        # A clean stop checkpoints what the worker holds: a restart replays nothing.
        checkpoint = checkpoint_repo.get(session, "pump-1")
        assert checkpoint is not None and checkpoint.sample_count == 61


@pytest.mark.anyio
async def test_workers_share_the_partitions_and_take_over_a_stopped_one(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    streams = [f"pump-{index}" for index in range(16)]
    with database.session() as session:
        for stream in streams:
            make_stream(session, stream)
    engines = [engine_for(database, models_dir, tmp_path / name) for name in ("a", "b")]
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    sent = dict.fromkeys(streams, 0)

    async def send_round(count: int) -> None:
        async def one(stream: str) -> None:
            body, times = batch(stream, sent[stream], count)
            answer = await submit(api, stream, body, times, with_results=False, wait_s=WAIT_S)
            assert answer.status == 200 and answered(answer)["accepted"] == count, answer
            sent[stream] += count

        await asyncio.gather(*(one(stream) for stream in streams))

    try:
        async with running(engines[0], nats.url, "worker-a") as a:
            await until(lambda: len(a.leases.held) == PARTITIONS, "a took every partition")
            b_bus = await open_bus(
                nats.url, name="worker-b", partitions=PARTITIONS, lease_s=LEASE_S
            )
            b = Worker(engines[1], b_bus, "worker-b")
            b_stop = asyncio.Event()
            b_task = asyncio.create_task(b.run(b_stop))
            await until(
                lambda: len(a.leases.held) == len(b.leases.held) == PARTITIONS // 2,
                "a gave b its share",
            )
            assert not set(a.leases.held) & set(b.leases.held)
            await send_round(10)
            assert a.committed and b.committed
            # Each worker exports the series of the streams it holds, and only those: a's
            # copies of the streams it gave b are gone (frozen, they would look stopped).
            for worker in (a, b):
                exported = {stream for stream, _ in worker.engine.metrics.snapshot()}
                held = {s for s in streams if partition_of(s, PARTITIONS) in worker.leases.held}
                assert exported == held, worker.name
            # b stops beating and consuming at once (as if killed): its leases expire, and a
            # takes its partitions back, resuming each stream from what b committed.
            b_task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b_task
            await b_bus.connection.close()
            await until(lambda: len(a.leases.held) == PARTITIONS, "a took b's partitions over")
            await send_round(10)
    finally:
        await api.close()
    with database.session() as session:
        for stream in streams:
            assert reading_repo.count(session, stream_id=stream) == sent[stream] == 20, stream


@pytest.mark.anyio
async def test_a_worker_that_lost_its_lease_cannot_commit(
    nats: NatsServer, database: Database
) -> None:
    first = await open_bus(nats.url, name="first", partitions=PARTITIONS, lease_s=LEASE_S)
    second = await open_bus(nats.url, name="second", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        old = Leases(first.leases, "old", PARTITIONS)
        await old.beat()
        assert 0 in old.held
        with database.session() as session:
            bus_repo.prepare(session, PARTITIONS)
        with database.session() as session:
            stale = bus_repo.take(session, 0)  # its epoch, counted in PostgreSQL
        with database.session() as session:
            bus_repo.fence(session, {0: stale})
        # It stops beating (paused) past its lease; another worker takes the partition.
        await asyncio.sleep(LEASE_S + 0.5)
        new = Leases(second.leases, "new", PARTITIONS)
        await new.beat()
        assert 0 in new.held
        with database.session() as session:
            taken = bus_repo.take(session, 0)
        assert taken == stale + 1
        with database.session() as session:
            bus_repo.fence(session, {0: taken})
        # The old one wakes and commits: refused, before it even learns it lost the lease.
        with pytest.raises(FencedError), database.session() as session:
            bus_repo.fence(session, {0: stale})
        # Fenced with other partitions in one transaction: refused all the same, and named.
        with database.session() as session:
            others = {1: bus_repo.take(session, 1), 2: bus_repo.take(session, 2)}
        with pytest.raises(FencedError) as refused, database.session() as session:
            bus_repo.fence(session, {**others, 0: stale})
        assert refused.value.extra["partitions"] == [0]
        with database.session() as session:
            bus_repo.fence(session, {**others, 0: taken})
        lost = await old.beat()
        assert 0 in lost.lost and 0 not in old.held
    finally:
        await first.close()
        await second.close()


@pytest.mark.anyio
async def test_batches_waiting_together_commit_together_and_a_bad_one_alone(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """Batches of distinct streams a worker finds waiting go in one transaction, as one POST
    of many streams would; one refused (an unknown stream) is answered on its own, and the
    others are committed all the same."""
    streams = ["pump-1", "pump-2", "pump-3"]
    with database.session() as session:
        for stream in streams:
            make_stream(session, stream)
    api = await open_bus(nats.url, name="api", partitions=1, lease_s=LEASE_S)
    try:
        waiting = []
        for stream in [*streams, "nobody"]:
            body, times = batch(stream, 0, 30)
            waiting.append(Batch(stream, body, times))
        await store_all(api, waiting)  # all in the one partition, before any worker runs
        engine = engine_for(database, models_dir, tmp_path)
        bus = await open_bus(nats.url, name="worker", partitions=1, lease_s=LEASE_S)
        worker = Worker(engine, bus, "worker")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await until(lambda: worker.committed == 3, "the three streams' batches committed")
            for _ in range(100):  # the unknown stream's batch answered (404) and gone too
                if (await api.jetstream.stream_info(STREAM)).state.messages == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await api.jetstream.stream_info(STREAM)).state.messages == 0
        finally:
            stop.set()
            await task
            await bus.close()
    finally:
        await api.close()
    with database.session() as session:
        for stream in streams:
            assert reading_repo.count(session, stream_id=stream) == 30


@pytest.mark.anyio
async def test_a_request_of_many_streams_is_answered_in_its_order_across_partitions(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """One request's batches go as one message a partition; the partitions' groups waiting
    together commit in one transaction; the answers come back in the request's order, a
    refused stream's problem among them while the others are committed."""
    streams = [f"pump-{index}" for index in range(12)]
    partitions = {partition_of(stream, PARTITIONS) for stream in streams}
    assert 1 < len(partitions) < len(streams)  # several partitions, some holding several
    with database.session() as session:
        for stream in streams:
            make_stream(session, stream)
    engine = engine_for(database, models_dir, tmp_path)
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        async with running(engine, nats.url, "worker") as worker:
            await until(lambda: len(worker.leases.held) == PARTITIONS, "the worker took them")
            order = [*streams[6:], "nobody", *streams[:6]]
            batches = [Batch(stream, *batch(stream, 0, 5)) for stream in order]
            answers = await submit_all(api, batches, with_results=True, wait_s=WAIT_S)
            assert len(answers) == len(order)
            for stream, answer in zip(order, answers, strict=True):
                if stream == "nobody":
                    assert answer.status == 404
                    assert json.loads(answer.body)["detail"].startswith("stream 'nobody'")
                else:
                    assert answer.status == 200, answer
                    body = answered(answer)
                    assert body["accepted"] == 5 and len(body["results"]) == 5
            assert worker.committed == len(streams)
    finally:
        await api.close()
    with database.session() as session:
        for stream in streams:
            assert reading_repo.count(session, stream_id=stream) == 5


@pytest.mark.anyio
async def test_a_change_is_made_by_the_worker_in_the_stream_s_turn(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """A switch published after readings waiting on the bus is made after them, by the worker,
    with the handler the embedded service runs; the readings after it run the new version.
    A deletion likewise: the stream's readings after it are refused as an unknown stream's."""
    engine_for(database, models_dir, tmp_path).database.dispose()  # version 1 registered
    write_fake_model(models_dir, "lstm-seed0", thresholds={"detectors": [NEVER]})
    engine = engine_for(database, models_dir, tmp_path)  # version 2, active: never alarms
    with database.session() as session:
        make_stream(session, "pump-1")
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        waiting = [Batch("pump-1", *batch("pump-1", 0, 60, swing=5.0))]
        await store_all(api, waiting)  # before any worker runs, as the switch is
        async with running(engine, nats.url, "worker") as worker:
            to_one = json.dumps({"name": "lstm-seed0", "version": 1}).encode()
            switched = await change(api, "pump-1", "switch", to_one, wait_s=WAIT_S)
            assert switched.status == 200, switched.body
            described = answered(switched)
            assert described["model_version"] == 1 and described["samples_seen"] == 60
            assert worker.committed == 1
            body, times = batch("pump-1", 60, 40, swing=5.0)
            loud = answered(
                await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            )
            assert {alarm["model_version"] for alarm in loud["opened"]} == {"1"}
            unknown = await change(api, "pump-1", "rename", b"{}", wait_s=WAIT_S)
            assert unknown.status == 422
            deleted = await change(api, "pump-1", "delete", b"", wait_s=WAIT_S)
            assert deleted.status == 204
            body, times = batch("pump-1", 100, 5)
            gone = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert gone.status == 404
    finally:
        await api.close()
    with database.session() as session:
        assert reading_repo.count(session, stream_id="pump-1") == 0


@pytest.mark.anyio
async def test_a_change_delivered_again_is_answered_as_it_was_and_made_once(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """A worker stopped after a change's commit, before its acknowledgement, leaves the message
    to be delivered again: that delivery is answered as the first was and changes nothing (a
    switch does not name the version it switched to as the one it replaced; a deletion is not
    refused as of an unknown stream)."""
    engine_for(database, models_dir, tmp_path).database.dispose()  # version 1 registered
    write_fake_model(models_dir, "lstm-seed0", thresholds={"detectors": [NEVER]})
    engine = engine_for(database, models_dir, tmp_path)  # version 2, active
    with database.session() as session:
        make_stream(session, "pump-1")
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        async with running(engine, nats.url, "worker") as worker:
            delivered: list[tuple[int, int, Any]] = []
            make = worker._change

            def recorded(partition: int, epoch: int, one: Any) -> Answer:
                delivered.append((partition, epoch, one))
                return make(partition, epoch, one)

            worker._change = recorded  # type: ignore[method-assign]
            to_one = json.dumps({"name": "lstm-seed0", "version": 1}).encode()
            switched = await change(api, "pump-1", "switch", to_one, wait_s=WAIT_S)
            assert switched.status == 200, switched.body
            assert answered(switched)["previous_model"] == {"name": "lstm-seed0", "version": 2}
            first = (switched.status, switched.body)
            again = await asyncio.to_thread(make, *delivered[0])
            assert (again.status, again.body) == first
            deleted = await change(api, "pump-1", "delete", b"", wait_s=WAIT_S)
            assert deleted.status == 204
            again = await asyncio.to_thread(make, *delivered[1])
            assert (again.status, again.body) == (204, deleted.body)
            # A change sent again by its client is another change: the stream is gone.
            resent = await change(api, "pump-1", "delete", b"", wait_s=WAIT_S)
            assert resent.status == 404
    finally:
        await api.close()
    with database.session() as session:
        assert reading_repo.count(session, stream_id="pump-1") == 0


@pytest.mark.anyio
async def test_a_worker_raises_a_stale_alarm_for_a_silent_stream_it_holds(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """Silence is watched where the stream is held: the worker that takes a partition restores
    its streams at once, so one that went silent before (under another worker) is seen to be,
    and its stale alarm is written under the partition's fence."""
    with database.session() as session:
        make_stream(session, "pump-1")  # 10 Hz: stale after 5 periods, half a second
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)
    try:
        quiet = engine_for(database, models_dir, tmp_path / "first")  # watches nothing
        async with running(quiet, nats.url, "first"):
            body, times = batch("pump-1", 0, 30)
            answer = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert answer.status == 200
        quiet.database.dispose()
        with database.session() as session:
            assert alarm_repo.list_open(session, stream_id="pump-1") == []

        engine = engine_for(database, models_dir, tmp_path / "second", stale_periods=5)
        async with running(engine, nats.url, "second") as worker:
            await until(lambda: len(worker.leases.held) == PARTITIONS, "the worker took them")

            def stale() -> bool:
                with database.session() as session:
                    open_ = alarm_repo.list_open(session, stream_id="pump-1")
                return [alarm.detector for alarm in open_] == ["stale"]

            await until(stale, "the silent stream's stale alarm")
            # Its next reading closes it, as in the embedded service.
            body, times = batch("pump-1", 30, 1)
            answer = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert [alarm["detector"] for alarm in answered(answer)["closed"]] == ["stale"]
    finally:
        await api.close()


@pytest.mark.anyio
async def test_a_stream_whose_readings_wait_in_the_worker_s_backlog_is_not_stale(
    nats: NatsServer, database: Database, models_dir: Path, tmp_path: Path
) -> None:
    """A worker behind (here, a commit that takes longer than the stale limit) leaves the
    readings waiting on the bus: the stream's silence is the worker's, and no stale alarm opens
    for it. Once nothing waits, the stream's own silence is watched again."""
    with database.session() as session:
        make_stream(session, "pump-1")  # 10 Hz: stale after 5 periods, half a second
    engine = engine_for(database, models_dir, tmp_path, stale_periods=5)
    api = await open_bus(nats.url, name="api", partitions=PARTITIONS, lease_s=LEASE_S)

    def stale_alarms() -> list[Any]:
        with database.session() as session:
            return list(
                session.scalars(
                    select(Alarm).where(Alarm.stream_id == "pump-1", Alarm.detector == "stale")
                )
            )

    try:
        async with running(engine, nats.url, "worker") as worker:
            await until(lambda: len(worker.leases.held) == PARTITIONS, "the worker took them")
            body, times = batch("pump-1", 0, 30)
            answer = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert answer.status == 200
            commit = worker._committed

            async def slowly(*args: Any) -> Any:
                await asyncio.sleep(2.5)  # five stale limits, two and more of the watch's rounds
                return await commit(*args)

            worker._committed = slowly  # type: ignore[method-assign]
            body, times = batch("pump-1", 30, 1)
            answer = await submit(api, "pump-1", body, times, with_results=False, wait_s=WAIT_S)
            assert answer.status == 200 and answered(answer)["closed"] == []
            assert stale_alarms() == []
            worker._committed = commit  # type: ignore[method-assign]
            await until(lambda: len(stale_alarms()) == 1, "the silent stream's stale alarm")
    finally:
        await api.close()


@pytest.mark.anyio
@pytest.mark.parametrize("lost_as", ["error", "result"])
async def test_a_worker_stops_when_a_cancellation_is_lost_on_its_way(
    nats: NatsServer,
    database: Database,
    models_dir: Path,
    tmp_path: Path,
    monkeypatch: Any,
    lost_as: str,
) -> None:
    """A cancellation can be lost inside the client: nats-py answers one that finds its
    connection closed with its own ConnectionClosedError ("error"), and Python 3.11's
    `asyncio.wait_for` returns a result that meets one instead of raising it ("result"). A
    partition's loop went on fetching for ever, so the worker's stop, or the event loop's
    shutdown after a failed test, never ended (the suite hung). Here every fetch loses its
    cancellation so: the stop still ends, with the partitions given back."""
    cancelled_fetches: list[int] = []
    released = asyncio.Event()  # set: fetches end as asked (so a failure here cannot hang)

    async def fetch(self: Any, batch: int = 1, timeout: float | None = 5.0, **_: Any) -> Any:
        try:
            await released.wait()
        except asyncio.CancelledError:
            if released.is_set():
                raise
            cancelled_fetches.append(1)
            if lost_as == "error":
                raise ConnectionClosedError from None
            return []
        raise asyncio.CancelledError

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch)
    engine = engine_for(database, models_dir, tmp_path)
    bus = await open_bus(nats.url, name="worker", partitions=PARTITIONS, lease_s=LEASE_S)
    worker = Worker(engine, bus, "worker")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await until(lambda: len(worker.leases.held) == PARTITIONS, "the worker took them")
        await until(lambda: len(worker.tasks) == PARTITIONS, "a task for each partition")
        await asyncio.sleep(0.5)  # (each in its fetch)
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=WAIT_S)
        assert done, "the worker did not stop"
        task.result()
        assert cancelled_fetches, "no fetch was cancelled"
        assert not worker.leases.held
    finally:
        released.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, timeout=WAIT_S)
        await bus.close()
