"""`twinwatch worker`: consume the partitions this worker leases, in order, through the same
ingest as the embedded service, and acknowledge a message only once its readings, alarms and
checkpoints are committed.

A message holds the batches (one stream's readings each) of one request that fall in one
partition, in the `POST /v1/readings` shape. A partition's messages are taken in order, in
groups of distinct streams; the groups waiting in all the partitions the worker holds are
committed in one transaction with their partitions' fences (`storage/repositories/bus.py`);
then the messages are acknowledged, then each request waiting for one (the `Twinwatch-Reply`
header) gets the answers the embedded service would have given. A message the database cannot
take now (it is away) is not acknowledged: it waits in JetStream and the partition tries again
from it, so nothing is lost and nothing overtakes it. A batch refused for what it holds (an
unknown stream, readings out of order) is answered with its problem, as the embedded service
would answer it, and the others are committed without it. A stream whose partition this worker
loses is forgotten here: its new owner restores it from its checkpoint and the readings stored
after it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from sqlalchemy.orm import Session

from app.bus.changes import CHANGES
from app.bus.jetstream import Bus, fits, worker_name
from app.bus.leases import Leases
from app.bus.messages import (
    MSG_ID_HEADER,
    REPLY_HEADER,
    Answer,
    Parsed,
    groups_of,
    more_behind,
    parse,
    problem_answer,
    published_at,
    readings_in,
    reply_of,
)
from app.bus.partitions import partition_of
from app.errors import AppError, DataError
from app.jobs.runner import JobRunner
from app.service.engine import Engine, ServiceState, resume_streams
from app.service.readings import answer_of, ingest_request
from app.storage.repositories import bus as bus_repo
from app.storage.repositories.bus import FencedError
from app.streams.ingest import IngestOutcome
from app.streams.stale import StaleWatch

log = logging.getLogger(__name__)
T = TypeVar("T")

FETCH_BATCH = 64  # messages asked for at once from a partition
FETCH_WAIT_S = 1.0  # how long a fetch waits for a message before the loop looks again
RETRY_S = 1.0  # how long a batch the database could not take waits before it is tried again
ACK_TIMEOUT_S = 10.0  # how long an acknowledgement waits for JetStream to confirm it
ACK_WAIT_S = 60.0  # a batch delivered and neither acknowledged nor answered is delivered again
OUTAGES = (OperationalError, InterfaceError, SQLAlchemyTimeoutError)


class StaleError(Exception):
    """A batch of a consumer whose partition this worker has lost (or taken again) since."""


class Worker:
    """One worker process: its leases, a task per partition it holds (for the lease it took
    it at), and the engine they share. Every commit runs on one thread, in the order asked
    (`self.executor`): transactions one at a time (one core's worth of work), and a
    partition's streams forgotten only after its last batch in hand. Taking a partition (its
    epoch, its streams restored) runs beside it, before the partition's first batch."""

    def __init__(self, engine: Engine, bus: Bus, name: str | None = None) -> None:
        self.engine = engine
        self.bus = bus
        self.name = name or worker_name()
        self.leases = Leases(bus.leases, self.name, bus.partitions)
        self.tasks: dict[int, tuple[int, asyncio.Task[None]]] = {}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinwatch-worker")
        self.committed = 0  # batches committed (tests and metrics read it)
        # partition -> (the lease it was taken at, the epoch PostgreSQL counted for it then)
        self.epochs: dict[int, tuple[int, int]] = {}
        self.waiting: list[_Work] = []  # groups for the next transaction
        # Partition -> when the oldest batch it has waiting was published (wall clock): a
        # backlog (the database away, a takeover, more than it keeps up with). Its streams'
        # silence is counted from then, not from their last commit: this worker's delay is
        # not their sensors' silence.
        self.backlog: dict[int, float] = {}
        self.committing: asyncio.Task[None] | None = None  # the task that commits them
        # The handlers of the changes it makes run with it; a job they queue waits for an API
        # process's runner (this one never starts).
        self.state = ServiceState.over(engine, JobRunner(engine.database, engine.settings))
        # What it writes on its own (fits, revisions, stale alarms) goes under the fence too.
        engine.streams.owns = self._own

    async def _run(self, function: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: beat, then a task for each partition held, none for another;
        the streams it holds watched for silence meanwhile (`TWINWATCH_STALE_PERIODS`)."""
        await self._run(self._prepare)
        settings = self.engine.settings
        watch = None
        if settings.stale_periods > 0:
            streams, metrics = self.engine.streams, self.engine.metrics
            watch = StaleWatch(
                streams,
                metrics,
                periods=settings.stale_periods,
                min_s=settings.stale_min_s,
                delay=self._delay,
            )
            watch.start()
        try:
            while not stop.is_set():
                stop_if_cancelled()
                try:
                    await self.leases.beat()
                except (nats.errors.Error, TimeoutError) as exc:
                    stop_if_cancelled(exc)
                    log.warning("worker %s: the bus is away (%s); trying again", self.name, exc)
                self._reconcile()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.bus.lease_s / 3)
        finally:
            if watch is not None:
                await asyncio.to_thread(watch.stop)
            # A clean stop: the streams of the partitions it still holds checkpointed under
            # their fences (before their tasks end: the fences are theirs), then the
            # partitions given back at once.
            try:
                await self._run(self.engine.streams.checkpoint_all)
            except Exception:
                log.exception("worker %s: checkpointing at the stop failed", self.name)
            for _, task in self.tasks.values():
                task.cancel()
            for _, task in self.tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.tasks.clear()
            if self.committing is not None:
                with contextlib.suppress(Exception):
                    await self.committing
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self.leases.release_all()
            self.executor.shutdown(wait=True)

    def _reconcile(self) -> None:
        """Whatever the heartbeat did (all of it, or part before it failed): a partition's task
        belongs to the lease it was taken at; one lost, or taken again since, is retired."""
        for partition, (acquired, task) in list(self.tasks.items()):
            if self.leases.acquired.get(partition) != acquired or task.done():
                del self.tasks[partition]
                task.cancel()
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.error(
                        "partition %d: its task failed; started again",
                        partition,
                        exc_info=task.exception(),
                    )
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

    def _lost(self, partition: int) -> None:
        """A partition another worker holds now: its streams forgotten, and their series gone
        from this worker's `/metrics` (the new owner's carry on; a copy frozen here would look
        to Prometheus like a stream that stopped sending)."""
        self._forget(partition)
        metrics = self.engine.metrics
        for stream_id, _ in metrics.snapshot():
            if partition_of(stream_id, self.bus.partitions) == partition:
                metrics.forget_stream(stream_id)

    def _delay(self, stream_id: str) -> float:
        """Seconds the stream's readings may have been waiting on the bus for this worker."""
        since = self.backlog.get(partition_of(stream_id, self.bus.partitions))
        return 0.0 if since is None else max(0.0, time.time() - since)

    def _resume(self, partition: int) -> None:
        """The partition's streams restored as soon as it is taken, not at their next batch:
        their metric series are here from then on, and a stream silent since is seen to be."""
        try:
            resume_streams(
                self.engine.database,
                self.engine.streams,
                self.engine.metrics,
                only=lambda stream_id: partition_of(stream_id, self.bus.partitions) == partition,
            )
        except OUTAGES as exc:  # restored at their next batch, then
            log.warning("partition %d: its streams not resumed (%s)", partition, exc)

    def _own(self, session: Session, stream_id: str) -> bool:
        """In `session`: the fence of the stream's partition if this worker holds it (for what
        it writes on its own: a fit adopted, a revision, a stale alarm); False if it does not."""
        partition = partition_of(stream_id, self.bus.partitions)
        acquired = self.leases.acquired.get(partition)
        epoch = None if acquired is None else self._epoch(partition, acquired)
        if epoch is None:
            return False
        try:
            bus_repo.fence(session, {partition: epoch})
        except FencedError:
            return False
        return True

    def _current(self, partition: int, acquired: int) -> bool:
        return self.leases.acquired.get(partition) == acquired

    def _epoch(self, partition: int, acquired: int) -> int | None:
        """The epoch the partition was taken at under this lease, while it is held."""
        taken = self.epochs.get(partition)
        if taken is None or taken[0] != acquired or not self._current(partition, acquired):
            return None
        return taken[1]

    async def _take(self, partition: int, acquired: int) -> int | None:
        """The partition taken in PostgreSQL (a new epoch) under this lease; None once the
        lease is not this one any more."""
        while self._current(partition, acquired):
            try:
                # Off the worker's database thread: a takeover may wait (5 s at most) for the
                # previous owner's commit, and the other partitions' commits need not.
                return await asyncio.to_thread(self._take_now, partition)
            except OUTAGES as exc:
                log.warning("partition %d: cannot take it (%s); trying again", partition, exc)
                await asyncio.sleep(RETRY_S)
        return None

    def _take_now(self, partition: int) -> int:
        with self.engine.database.session() as session:
            return bus_repo.take(session, partition)

    async def _consume(self, partition: int, acquired: int) -> None:
        await self._run(self._forget, partition)  # (after any batch of an earlier lease)
        epoch = await self._take(partition, acquired)
        if epoch is None:
            return
        self.epochs[partition] = (acquired, epoch)
        self.backlog[partition] = time.time()  # (until its first fetch says how far behind)
        await asyncio.to_thread(self._resume, partition)  # (the others commit meanwhile)
        subscription = await self._subscribe(partition, acquired)
        try:
            while subscription is not None and self._current(partition, acquired):
                stop_if_cancelled()
                try:
                    messages = await subscription.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError) as exc:
                    stop_if_cancelled(exc)
                    self.backlog.pop(partition, None)  # nothing waits
                    continue
                except Exception as exc:  # the bus away, or anything: never a silent stop
                    stop_if_cancelled(exc)
                    log.warning("partition %d: fetch failed (%r); trying again", partition, exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                if messages:
                    self.backlog[partition] = published_at(messages[0])
                if await self._handle(partition, acquired, messages):
                    if messages and more_behind(messages[-1]):
                        self.backlog[partition] = published_at(messages[-1])
                    else:
                        self.backlog.pop(partition, None)
                    continue
                # From the first batch not acknowledged, again, in order (the database was
                # away, a batch failed, or an acknowledgement did not get through: a batch
                # committed and delivered again is re-sent readings).
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await subscription.unsubscribe()
                subscription = await self._subscribe(partition, acquired)
        finally:
            if self.epochs.get(partition, (None, 0))[0] == acquired:
                del self.epochs[partition]
                self.backlog.pop(partition, None)
            if not self._current(partition, acquired):  # lost: what it held goes too
                await self._run(self._lost, partition)
            if subscription is not None:
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await subscription.unsubscribe()

    async def _subscribe(
        self, partition: int, acquired: int
    ) -> JetStreamContext.PullSubscription | None:
        """A fresh consumer of the partition while its lease is this one's; None once not."""
        while self._current(partition, acquired):
            stop_if_cancelled()
            try:
                return await self.bus.consumer(partition, ack_wait_s=ACK_WAIT_S, batch=FETCH_BATCH)
            except (nats.errors.Error, TimeoutError) as exc:
                stop_if_cancelled(exc)
                log.warning("partition %d: cannot consume (%s); trying again", partition, exc)
                await asyncio.sleep(RETRY_S)
        return None

    async def _handle(self, partition: int, acquired: int, messages: list[Msg]) -> bool:
        """The messages in order, in groups of distinct streams, each committed in one
        transaction (with whatever other partitions have waiting then); False at the first
        group not taken (it and the rest stay unacknowledged, to be delivered again in
        order)."""
        most = self.engine.settings.max_batch
        for group in groups_of([parse(message) for message in messages], most):
            try:
                answers = await self._committed(partition, acquired, group)
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
            for one in group:
                try:
                    await one.message.ack_sync(timeout=ACK_TIMEOUT_S)
                except (nats.errors.Error, TimeoutError) as exc:
                    stop_if_cancelled(exc)
                    log.warning("partition %d: an acknowledgement failed (%s)", partition, exc)
                    for rest, answered in zip(group, answers, strict=True):
                        await self._reply(rest.message, answered)  # committed all the same
                    return False
            for one, answered in zip(group, answers, strict=True):
                await self._reply(one.message, answered)
        return True

    async def _committed(
        self, partition: int, acquired: int, group: list[Parsed]
    ) -> list[list[Answer]]:
        """The group committed, and its messages' answers. Groups of other partitions that
        come while a transaction runs wait for the next, and go in it together."""
        work = _Work(partition, acquired, group, asyncio.get_running_loop().create_future())
        self.waiting.append(work)
        if self.committing is None or self.committing.done():
            self.committing = asyncio.create_task(self._commit_waiting())
        return await work.answers

    async def _commit_waiting(self) -> None:
        while self.waiting:
            works = self._next_transaction()
            if not works:
                continue
            try:
                outcomes: list[list[list[Answer]] | BaseException] = await self._run(
                    self._process, works
                )
            except asyncio.CancelledError:  # no group left waiting for ever
                for work in works:
                    work.answers.cancel()
                raise
            except Exception as exc:  # (the executor shut down)
                outcomes = [exc] * len(works)
            for work, outcome in zip(works, outcomes, strict=True):
                if work.answers.done():  # its partition's task was cancelled meanwhile
                    continue
                if isinstance(outcome, BaseException):
                    work.answers.set_exception(outcome)
                else:
                    work.answers.set_result(outcome)

    def _next_transaction(self) -> list[_Work]:
        """The groups waiting, in order, up to as many readings as one request may hold
        (`TWINWATCH_MAX_BATCH`; one group at least): a transaction no larger than the
        embedded service commits. The rest wait for the next."""
        most = self.engine.settings.max_batch
        taken: list[_Work] = []
        readings = 0
        while self.waiting:
            work = self.waiting[0]
            size = sum(readings_in(one) for one in work.group)
            if taken and readings + size > most:
                break
            self.waiting.pop(0)
            if not work.answers.done():  # (its partition's task was cancelled meanwhile)
                taken.append(work)
                readings += size
        return taken

    def _process(self, works: list[_Work]) -> list[list[list[Answer]] | BaseException]:
        """Groups of several partitions, committed with their partitions' fences in one
        transaction (on the worker's one thread), as one `POST /v1/readings` of them would be.
        If that fails for what a batch holds, or for a fence, each group is committed on its
        own, and then, if it still fails for a batch, each of its batches on its own: only
        that one is refused."""
        outcomes: list[list[list[Answer]] | BaseException] = [StaleError()] * len(works)
        fenced: list[tuple[int, int]] = []  # (work, the epoch its partition was taken at)
        for index, work in enumerate(works):
            epoch = self._epoch(work.partition, work.acquired)
            if epoch is None:
                continue
            if work.group[0].change is None:
                fenced.append((index, epoch))
                continue
            try:  # a change: in a transaction of its own
                outcomes[index] = [[self._change(work.partition, epoch, work.group[0])]]
            except Exception as exc:
                outcomes[index] = exc
        if len(fenced) > 1:
            try:
                answers = self._commit(
                    [(works[i].partition, epoch) for i, epoch in fenced],
                    [works[i].group for i, _ in fenced],
                )
                for (index, _), answered in zip(fenced, answers, strict=True):
                    outcomes[index] = answered
                return outcomes
            except OUTAGES as exc:  # the database away: each group waits and tries again
                for index, _ in fenced:
                    outcomes[index] = exc
                return outcomes
            except Exception:  # (a fence, a refusal, a bug): each on its own, below
                log.debug("a transaction of several partitions failed", exc_info=True)
        for index, epoch in fenced:
            try:
                outcomes[index] = self._process_alone(works[index], epoch)
            except Exception as exc:
                outcomes[index] = exc
        return outcomes

    def _change(self, partition: int, epoch: int, one: Parsed) -> Answer:
        """A change of a stream, made by the handler the embedded service runs for it, in one
        transaction with the partition's fence and the answer kept by the message's id: made
        once however often the message is delivered."""
        handler = CHANGES.get(one.change or "")
        if handler is None or one.stream is None:
            return problem_answer(DataError(f"not a change a worker makes: {one.change!r}"))
        message_id = (one.message.headers or {}).get(MSG_ID_HEADER)
        try:
            with self.engine.database.session() as session:
                bus_repo.fence(session, {partition: epoch})
                made = None if message_id is None else bus_repo.change_made(session, message_id)
                if made is not None:
                    return Answer(made.status, made.body, made.media_type)
                answer = handler(self.state, session, one.stream, one.message.data)
                if message_id is not None:
                    bus_repo.record_change(
                        session,
                        message_id,
                        status=answer.status,
                        body=answer.body,
                        media_type=answer.media_type,
                        now=datetime.now(UTC),
                    )
                return answer
        except FencedError:
            raise
        except AppError as exc:
            return problem_answer(exc)
        except ValidationError as exc:  # the API checked it: only a foreign publisher
            return problem_answer(DataError(f"not a change of a stream: {exc.errors()[0]['msg']}"))

    def _process_alone(self, work: _Work, epoch: int) -> list[list[Answer]]:
        fence = [(work.partition, epoch)]
        try:
            (answers,) = self._commit(fence, [work.group])
            return answers
        except FencedError:
            raise
        except AppError as exc:
            if sum(len(one.batches) for one in work.group) == 1:
                return [
                    [problem_answer(one.problem)] if one.problem else [problem_answer(exc)]
                    for one in work.group
                ]
            # one of its batches: each on its own, below
        answers = [[problem_answer(one.problem)] if one.problem else [] for one in work.group]
        for one, answered in zip(work.group, answers, strict=True):
            for batch in one.batches:
                single = Parsed(one.message, [batch], one.with_results, None)
                try:
                    ((answer,),) = self._commit(fence, [[single]])[0]
                except FencedError:
                    raise
                except AppError as exc:
                    answer = problem_answer(exc)
                answered.append(answer)
        return answers

    def _commit(
        self, fences: list[tuple[int, int]], groups: list[list[Parsed]]
    ) -> list[list[list[Answer]]]:
        """One transaction: the partitions' fences, then every batch of the groups; each
        message's answers (a problem for one that was not a batch of readings)."""
        engine = self.engine
        batches = [batch for group in groups for one in group for batch in one.batches]
        with engine.database.session() as session:
            bus_repo.fence(session, dict(fences))
            outcomes = iter(
                ingest_request(
                    engine.settings,
                    engine.streams,
                    engine.metrics,
                    session,
                    [(batch.stream, batch.readings) for batch in batches],
                    count_refused=len(batches) == 1,  # (else tried again one by one)
                )
            )
        self.committed += len(batches)
        answers: list[list[list[Answer]]] = []
        for group in groups:
            answers.append([])
            for one in group:
                mine = [next(outcomes) for _ in one.batches]
                answers[-1].append(
                    [problem_answer(one.problem)] if one.problem else self._answers(mine, one)
                )
        return answers

    def _answers(self, outcomes: list[IngestOutcome], one: Parsed) -> list[Answer]:
        """A message's answers, with a result per reading if asked and if they fit in one
        message; else without (saying so)."""
        if one.with_results:
            answers = [Answer(200, to_json(answer_of(outcome, True))) for outcome in outcomes]
            if len(reply_of(answers)) <= fits(self.bus):
                return answers
        omitted = one.with_results
        return [
            Answer(200, to_json(answer_of(outcome, False)), results_omitted=omitted)
            for outcome in outcomes
        ]

    async def _reply(self, message: Msg, answers: list[Answer]) -> None:
        reply = (message.headers or {}).get(REPLY_HEADER)
        if not reply:
            return
        with contextlib.suppress(nats.errors.Error):
            await self.bus.connection.publish(reply, reply_of(answers))


@dataclass(frozen=True)
class _Work:
    """A partition's group of messages waiting for a transaction, and their answers to come."""

    partition: int
    acquired: int
    group: list[Parsed]
    answers: asyncio.Future[list[list[Answer]]]


def stop_if_cancelled(error: BaseException | None = None) -> None:
    """Raise CancelledError if the running task was asked to stop. A cancellation can be lost
    on its way: nats-py answers one that finds its connection closed with its own
    ConnectionClosedError (an ordinary error), and Python 3.11's `asyncio.wait_for` drops one
    that meets its result. A retry loop that took either for the bus being away, or went on
    after it, would run for ever (a stop waiting on it, or an event loop's shutdown); each
    calls this where it catches an error and once a round."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from error
