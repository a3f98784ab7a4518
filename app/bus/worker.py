"""`twinwatch worker`: consume the partitions this worker leases, in order, through the same
ingest as the embedded service, and acknowledge a batch only once its readings, alarms and
checkpoints are committed.

A batch is one stream's readings (`StreamReadingsIn` as JSON). For each: the partition's fence
and the ingest run in one transaction (`storage/repositories/bus.py`), then the message is
acknowledged, then the request waiting for it (the `Twinwatch-Reply` header) gets the answer
the embedded service would have given. A batch the database cannot take now (it is away) is
not acknowledged: it waits in JetStream and the partition tries again from it, so nothing is
lost and nothing overtakes it. A batch refused for what it holds (an unknown stream, readings
out of order) is acknowledged with its problem as the answer, as the embedded service would
answer it. A stream whose partition this worker loses is forgotten here: its new owner restores
it from its checkpoint and the readings stored after it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import start_http_server
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from app.api.readings import answer_of, ingest_request
from app.bus.jetstream import Bus, open_bus, worker_name
from app.bus.leases import Leases
from app.bus.messages import OMITTED_HEADER, REPLY_HEADER, RESULTS_HEADER, STATUS_HEADER, Answer
from app.bus.partitions import partition_of
from app.errors import AppError, DataError
from app.main import Engine, open_engine
from app.metrics import Metrics
from app.registry import default_loader
from app.schemas import PROBLEM_MEDIA_TYPE, StreamReadingsIn
from app.settings import Settings
from app.storage.repositories import bus as bus_repo
from app.storage.repositories.bus import FencedError

log = logging.getLogger(__name__)

FETCH_BATCH = 64  # messages asked for at once from a partition
FETCH_WAIT_S = 1.0  # how long a fetch waits for a message before the loop looks again
RETRY_S = 1.0  # how long a batch the database could not take waits before it is tried again
ACK_TIMEOUT_S = 10.0  # how long an acknowledgement waits for JetStream to confirm it
ACK_WAIT_S = 60.0  # a batch delivered and neither acknowledged nor answered is delivered again
OUTAGES = (OperationalError, InterfaceError, SQLAlchemyTimeoutError)
INTERNAL_ERROR = {
    "type": "https://twinwatch.dev/problems/internal-error",
    "title": "Internal server error",
    "status": 500,
    "detail": "an unexpected error occurred; it has been logged (by the worker)",
}


class Worker:
    """One worker process: its leases, a task per partition it holds, and the engine they
    share. Batches are processed one at a time (one core's worth of work)."""

    def __init__(self, engine: Engine, bus: Bus, name: str | None = None) -> None:
        self.engine = engine
        self.bus = bus
        self.name = name or worker_name()
        self.leases = Leases(bus.leases, self.name, bus.partitions)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.processing = threading.Lock()
        self.committed = 0  # batches committed (tests and metrics read it)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: beat, follow what was gained and lost, consume."""
        await asyncio.to_thread(self._prepare)
        try:
            while not stop.is_set():
                try:
                    changes = await self.leases.beat()
                except (nats.errors.Error, TimeoutError) as exc:
                    log.warning("worker %s: the bus is away (%s); trying again", self.name, exc)
                else:
                    for partition in changes.lost:
                        await self._drop(partition)
                    for partition in changes.gained:
                        self.tasks[partition] = asyncio.create_task(self._consume(partition))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.bus.lease_s / 3)
        finally:
            # A clean stop: its streams checkpointed while it still holds their partitions,
            # then the partitions given back at once.
            for task in self.tasks.values():
                task.cancel()
            for task in self.tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.tasks.clear()
            await asyncio.to_thread(self._checkpoint_all)
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self.leases.release_all()

    def _checkpoint_all(self) -> None:
        with self.processing:
            self.engine.streams.checkpoint_all()

    def _prepare(self) -> None:
        with self.engine.database.sessions() as session:
            bus_repo.prepare(session, self.bus.partitions)

    async def _drop(self, partition: int) -> None:
        """Stop consuming a partition and forget its streams (their next owner restores them
        from what was committed). Its lease is the caller's business: lost already, or
        taken again in the same heartbeat (then a new task starts on what was committed)."""
        task = self.tasks.pop(partition, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self._forget, partition)

    def _forget(self, partition: int) -> None:
        with self.processing:
            streams = self.engine.streams
            for live in streams.live_streams():
                if partition_of(live.stream_id, self.bus.partitions) == partition:
                    streams.forget(live.stream_id)

    async def _consume(self, partition: int) -> None:
        subscription = await self._subscribe(partition)
        try:
            while partition in self.leases.held:
                try:
                    messages = await subscription.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                except Exception as exc:  # the bus away, or anything: never a silent stop
                    log.warning("partition %d: fetch failed (%r); trying again", partition, exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                try:
                    whole = await self._handle(partition, messages)
                except Exception:  # never a partition left without its task
                    log.exception("partition %d: handling batches failed", partition)
                    whole = False
                if not whole:
                    # From the first batch not acknowledged, again, in order (the database was
                    # away, or an acknowledgement did not get through: a batch committed and
                    # delivered again is re-sent readings).
                    await asyncio.sleep(RETRY_S)
                    with contextlib.suppress(nats.errors.Error):
                        await subscription.unsubscribe()
                    subscription = await self._subscribe(partition)
        finally:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await subscription.unsubscribe()

    async def _subscribe(self, partition: int) -> JetStreamContext.PullSubscription:
        while True:
            try:
                return await self.bus.consumer(partition, ack_wait_s=ACK_WAIT_S, batch=FETCH_BATCH)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("partition %d: cannot consume (%s); trying again", partition, exc)
                await asyncio.sleep(RETRY_S)

    async def _handle(self, partition: int, messages: list[Msg]) -> bool:
        """The messages in order; False at the first the database cannot take or whose
        acknowledgement fails (it and the rest stay unacknowledged, to be delivered again in
        order)."""
        for message in messages:
            revision = self.leases.held.get(partition)
            if revision is None:
                return True  # lost meanwhile: the next owner has them (unacknowledged)
            try:
                answer = await asyncio.to_thread(self._process, partition, revision, message)
            except FencedError as exc:
                log.warning("worker %s: %s", self.name, exc)
                self.leases.held.pop(partition, None)
                asyncio.get_running_loop().create_task(self._drop(partition))
                return True
            except OUTAGES as exc:
                log.warning("partition %d: the database is away (%s); waiting", partition, exc)
                return False
            except Exception:  # a bug: answered 500 as the embedded service would, not retried
                log.exception("partition %d: a batch failed unexpectedly", partition)
                answer = Answer(500, to_json(INTERNAL_ERROR), PROBLEM_MEDIA_TYPE)
            try:
                await message.ack_sync(timeout=ACK_TIMEOUT_S)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("partition %d: an acknowledgement failed (%s)", partition, exc)
                await self._reply(message, answer)  # committed all the same
                return False
            await self._reply(message, answer)
        return True

    def _process(self, partition: int, revision: int, message: Msg) -> Answer:
        """One batch, committed with the partition's fence; its answer."""
        headers = message.headers or {}
        with_results = headers.get(RESULTS_HEADER, "1") != "0"
        engine = self.engine
        with self.processing:
            try:
                item = StreamReadingsIn.model_validate_json(message.data)
            except ValidationError as exc:  # the API checked it: only a foreign publisher
                return _problem(DataError(f"not a batch of readings: {exc.errors()[0]['msg']}"))
            try:
                with engine.database.session() as session:
                    bus_repo.fence(session, partition, revision)
                    outcomes = ingest_request(
                        engine.settings,
                        engine.streams,
                        engine.metrics,
                        session,
                        [(item.stream, item.readings)],
                    )
            except FencedError:
                raise
            except AppError as exc:
                return _problem(exc)
            self.committed += 1
            body = to_json(answer_of(outcomes[0], with_results))
            if len(body) <= self.bus.connection.max_payload:
                return Answer(200, body)
            return Answer(200, to_json(answer_of(outcomes[0], False)), results_omitted=True)

    async def _reply(self, message: Msg, answer: Answer) -> None:
        reply = (message.headers or {}).get(REPLY_HEADER)
        if not reply:
            return
        with contextlib.suppress(nats.errors.Error):
            headers = {STATUS_HEADER: str(answer.status), "Content-Type": answer.media_type}
            if answer.results_omitted:
                headers[OMITTED_HEADER] = "1"
            await self.bus.connection.publish(reply, answer.body, headers=headers)


def _problem(error: AppError) -> Answer:
    return Answer(error.status, to_json(error.problem()), PROBLEM_MEDIA_TYPE)


async def run_worker(settings: Settings, *, metrics_port: int | None, name: str | None) -> None:
    """The `twinwatch worker` process: until SIGTERM or SIGINT (then its partitions are given
    back at once, after a checkpoint of its streams)."""
    if not settings.bus_url:
        raise DataError("a worker needs the bus: set TWINWATCH_BUS_URL (nats://host:4222)")
    metrics = Metrics(settings.metrics_per_stream)
    engine = await asyncio.to_thread(open_engine, settings, metrics, default_loader)
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    name = name or worker_name()
    bus = await open_bus(
        settings.bus_url,
        name=name,
        partitions=settings.bus_partitions,
        lease_s=settings.bus_lease_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("worker %s on %s, %d partitions", name, settings.bus_url, bus.partitions)
    try:
        await Worker(engine, bus, name).run(stop)
    finally:
        await bus.close()
        await asyncio.to_thread(engine.learner.shutdown)
        engine.database.dispose()
