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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import start_http_server
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from app.api.readings import answer_of, ingest_request
from app.bus.jetstream import Bus, fits, open_bus, worker_name
from app.bus.leases import Leases
from app.bus.messages import (
    MSG_ID_HEADER,
    OMITTED_HEADER,
    REPLY_HEADER,
    RESULTS_HEADER,
    STATUS_HEADER,
    Answer,
)
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
T = TypeVar("T")

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


class StaleError(Exception):
    """A batch of a consumer whose partition this worker has lost (or taken again) since."""


class Worker:
    """One worker process: its leases, a task per partition it holds (for the lease it took
    it at), and the engine they share. Every database step runs on one thread, in the order
    asked (`self.executor`): batches one at a time (one core's worth of work), and a
    partition's streams forgotten only after its last batch in hand."""

    def __init__(self, engine: Engine, bus: Bus, name: str | None = None) -> None:
        self.engine = engine
        self.bus = bus
        self.name = name or worker_name()
        self.leases = Leases(bus.leases, self.name, bus.partitions)
        self.tasks: dict[int, tuple[int, asyncio.Task[None]]] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinwatch-worker")
        self.committed = 0  # batches committed (tests and metrics read it)

    async def _run(self, function: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: beat, then a task for each partition held, none for another."""
        await self._run(self._prepare)
        try:
            while not stop.is_set():
                try:
                    await self.leases.beat()
                except (nats.errors.Error, TimeoutError) as exc:
                    log.warning("worker %s: the bus is away (%s); trying again", self.name, exc)
                self._reconcile()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.bus.lease_s / 3)
        finally:
            # A clean stop: its streams checkpointed while it still holds their partitions,
            # then the partitions given back at once.
            for _, task in self.tasks.values():
                task.cancel()
            for _, task in self.tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.tasks.clear()
            await self._run(self.engine.streams.checkpoint_all)
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self.leases.release_all()
            self.executor.shutdown(wait=True)

    def _reconcile(self) -> None:
        """Whatever the heartbeat did (all of it, or part before it failed): a partition's task
        belongs to the lease it was taken at; one lost, or taken again since, is retired."""
        for partition, (acquired, task) in list(self.tasks.items()):
            if self.leases.acquired.get(partition) != acquired:
                del self.tasks[partition]
                task.cancel()
        for partition, acquired in self.leases.acquired.items():
            if partition not in self.tasks:
                task = asyncio.create_task(self._consume(partition, acquired))
                self.tasks[partition] = (acquired, task)

    def _prepare(self) -> None:
        with self.engine.database.sessions() as session:
            bus_repo.prepare(session, self.bus.partitions)

    def _forget(self, partition: int) -> None:
        """The partition's streams forgotten: restored, on their next batch, from what was
        committed (by whoever held the partition meanwhile)."""
        streams = self.engine.streams
        for live in streams.live_streams():
            if partition_of(live.stream_id, self.bus.partitions) == partition:
                streams.forget(live.stream_id)

    def _current(self, partition: int, acquired: int) -> bool:
        return self.leases.acquired.get(partition) == acquired

    async def _consume(self, partition: int, acquired: int) -> None:
        await self._run(self._forget, partition)  # (after any batch of an earlier lease)
        subscription = await self._subscribe(partition, acquired)
        try:
            while subscription is not None and self._current(partition, acquired):
                try:
                    messages = await subscription.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                except Exception as exc:  # the bus away, or anything: never a silent stop
                    log.warning("partition %d: fetch failed (%r); trying again", partition, exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                if await self._handle(partition, acquired, messages):
                    continue
                # From the first batch not acknowledged, again, in order (the database was
                # away, a batch failed, or an acknowledgement did not get through: a batch
                # committed and delivered again is re-sent readings).
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await subscription.unsubscribe()
                subscription = await self._subscribe(partition, acquired)
        finally:
            if subscription is not None:
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await subscription.unsubscribe()

    async def _subscribe(
        self, partition: int, acquired: int
    ) -> JetStreamContext.PullSubscription | None:
        """A fresh consumer of the partition while its lease is this one's; None once not."""
        while self._current(partition, acquired):
            try:
                return await self.bus.consumer(partition, ack_wait_s=ACK_WAIT_S, batch=FETCH_BATCH)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("partition %d: cannot consume (%s); trying again", partition, exc)
                await asyncio.sleep(RETRY_S)
        return None

    async def _handle(self, partition: int, acquired: int, messages: list[Msg]) -> bool:
        """The messages in order, in groups of distinct streams each committed in one
        transaction; False at the first group not taken (it and the rest stay unacknowledged,
        to be delivered again in order)."""
        for group in _groups(messages):
            try:
                answers = await self._run(self._process, partition, acquired, group)
            except StaleError:
                return True  # the partition is another's, or another lease's: not acknowledged
            except FencedError as exc:
                log.warning("worker %s: %s", self.name, exc)
                if self._current(partition, acquired):  # lost: given up until taken again
                    self.leases.held.pop(partition, None)
                    self.leases.acquired.pop(partition, None)
                return True
            except OUTAGES as exc:
                log.warning("partition %d: the database is away (%s); waiting", partition, exc)
                return False
            except Exception:  # a bug, or a state gone stale: its streams restored, tried again
                log.exception("partition %d: a batch failed; its streams are restored", partition)
                await self._run(self._forget, partition)
                return False
            for message in group:
                try:
                    await message.ack_sync(timeout=ACK_TIMEOUT_S)
                except (nats.errors.Error, TimeoutError) as exc:
                    log.warning("partition %d: an acknowledgement failed (%s)", partition, exc)
                    for rest, answered in zip(group, answers, strict=True):
                        await self._reply(rest, answered)  # committed all the same
                    return False
            for message, answer in zip(group, answers, strict=True):
                await self._reply(message, answer)
        return True

    def _process(self, partition: int, acquired: int, group: list[Msg]) -> list[Answer]:
        """A group of batches of distinct streams, committed with the partition's fence in one
        transaction (on the worker's one thread), as one `POST /v1/readings` of them would be;
        if one of them is refused, each is committed on its own, so only it is."""
        revision = self.leases.held.get(partition)
        if revision is None or not self._current(partition, acquired):
            raise StaleError()
        answers: list[Answer | None] = []
        items: list[tuple[int, StreamReadingsIn, bool]] = []
        for index, message in enumerate(group):
            try:
                item = StreamReadingsIn.model_validate_json(message.data)
            except ValidationError as exc:  # the API checked it: only a foreign publisher
                detail = f"not a batch of readings: {exc.errors()[0]['msg']}"
                answers.append(_problem(DataError(detail)))
                continue
            answers.append(None)
            with_results = (message.headers or {}).get(RESULTS_HEADER, "1") != "0"
            items.append((index, item, with_results))
        if len(items) > 1:
            try:
                committed = self._commit(revision, partition, items)
                for (index, _, _), answer in zip(items, committed, strict=True):
                    answers[index] = answer
                return [answer for answer in answers if answer is not None]
            except FencedError:
                raise
            except AppError:
                pass  # one of them: each on its own, below
        for one in items:
            try:
                (answers[one[0]],) = self._commit(revision, partition, [one])
            except FencedError:
                raise
            except AppError as exc:
                answers[one[0]] = _problem(exc)
        return [answer for answer in answers if answer is not None]

    def _commit(
        self, revision: int, partition: int, items: list[tuple[int, StreamReadingsIn, bool]]
    ) -> list[Answer]:
        engine = self.engine
        with engine.database.session() as session:
            bus_repo.fence(session, partition, revision)
            outcomes = ingest_request(
                engine.settings,
                engine.streams,
                engine.metrics,
                session,
                [(item.stream, item.readings) for _, item, _ in items],
            )
        self.committed += len(items)
        answers = []
        for outcome, (_, _, with_results) in zip(outcomes, items, strict=True):
            body = to_json(answer_of(outcome, with_results))
            if len(body) <= fits(self.bus):
                answers.append(Answer(200, body))
            else:
                answers.append(
                    Answer(200, to_json(answer_of(outcome, False)), results_omitted=True)
                )
        return answers

    async def _reply(self, message: Msg, answer: Answer) -> None:
        reply = (message.headers or {}).get(REPLY_HEADER)
        if not reply:
            return
        with contextlib.suppress(nats.errors.Error):
            headers = {STATUS_HEADER: str(answer.status), "Content-Type": answer.media_type}
            if answer.results_omitted:
                headers[OMITTED_HEADER] = "1"
            await self.bus.connection.publish(reply, answer.body, headers=headers)


GROUP = 256  # batches committed together at most (a POST of many streams' readings)


def _groups(messages: list[Msg]) -> list[list[Msg]]:
    """The messages in order, cut where a stream comes again (one request holds a stream once)
    or a group is full. Streams are told apart by the batch's message id (`stream/...`)."""
    groups: list[list[Msg]] = []
    seen: set[str] = set()
    for message in messages:
        stream = ((message.headers or {}).get(MSG_ID_HEADER) or "").split("/", 1)[0]
        if not groups or stream in seen or not stream or len(groups[-1]) >= GROUP:
            groups.append([])
            seen = set()
        groups[-1].append(message)
        seen.add(stream)
    return groups


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
        replicas=settings.bus_replicas,
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
