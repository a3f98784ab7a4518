"""The live engine: each stream's state in memory, and the ingest unit of work around it.

A readings request is one transaction: the new readings, every alarm they open or close and the
stream's checkpoint are committed together, and only then does the in-memory state move on. If
anything fails, the transaction rolls back and the stream is exactly as it was, so a client can
re-send the batch. Re-sent readings (same time, same value) are recognised and not processed
twice; one stream is processed by one request at a time.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.errors import AppError, ArtifactError, ConflictError, DataError
from app.metrics import Metrics, StreamSeries
from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.monitor import Monitor, MonitorConfig
from app.registry import ModelRegistry, RegisteredModel
from app.schemas import ReadingIn
from app.storage.db import Database, DatabaseError
from app.storage.models import Alarm, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.helpers import helper_pool
from app.streams.processor import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_MAX_GAP,
    STATE_VERSION,
    BatchResult,
    StreamProcessor,
    StreamState,
)

log = logging.getLogger(__name__)

# A reading's fields, read by `map` over a batch (a third of a comprehension's cost per reading).
_TIME, _VALUE, _VALUES = attrgetter("t"), attrgetter("value"), attrgetter("values")
_REFERENCE = attrgetter("reference")

QUICK_TICKS = 8
"""From this many single-reading streams in one request, they are validated together."""


def monitor_config(model: RegisteredModel, overrides: dict[str, Any]) -> MonitorConfig:
    """The model's calibrated detectors with the stream's overrides applied."""
    if not model.thresholds:
        raise ArtifactError(
            f"model {model.name!r} has no detector thresholds: run `twinwatch calibrate` on it"
        )
    base = MonitorConfig.from_manifest(model.manifest)
    detectors = []
    for detector in base.detectors:
        override = overrides.get(detector.kind, {})
        if not override.get("enabled", True):
            continue
        update: dict[str, Any] = {}
        if override.get("threshold") is not None:
            update["threshold"] = float(override["threshold"])
        if override.get("policy") is not None:
            update["alarm"] = AlarmPolicy.model_validate(override["policy"])
        detectors.append(detector.model_copy(update=update))
    if not detectors:
        raise DataError("every detector is disabled: the stream would never alarm")
    return base.model_copy(update={"detectors": detectors})


@dataclass
class LiveStream:
    """A stream as the engine holds it between requests."""

    stream_id: str
    model: RegisteredModel
    channels: list[str]
    has_reference: bool
    sample_period_s: float
    processor: StreamProcessor
    state: StreamState
    last_t: datetime | None
    checkpoint_due: int  # write the next checkpoint once the stream has seen this many readings
    series: StreamSeries | None = None  # its Prometheus series (None: not published)
    # The peak of each alarm open after the last batch, as its row holds it: a batch that
    # moves none touches no alarm row.
    open_peaks: dict[str, float] = field(default_factory=dict)
    last_micro: int | None = field(init=False)  # `last_t` as `reading_repo.micro` gives it

    def __post_init__(self) -> None:
        self.last_micro = None if self.last_t is None else reading_repo.micro(self.last_t)
        self.open_peaks = self.state.monitor.open_peaks()

    def moved_to(self, last_t: datetime, micro: int | None = None) -> None:
        """The stream's last accepted reading is now at `last_t` (`micro`, if known)."""
        self.last_t = last_t
        self.last_micro = reading_repo.micro(last_t) if micro is None else micro

    @property
    def detectors(self) -> list[str]:
        return list(self.state.monitor.detectors)


@dataclass(frozen=True)
class StreamView:
    """A consistent copy of what reads show about a live stream."""

    samples: int
    last_t: datetime | None
    warmup_remaining: int
    last_forecast: float | None
    last_residual: float | None
    statistics: dict[str, float]
    thresholds: dict[str, float]
    active: set[str]


@dataclass(slots=True)  # (frozen would double the cost of one per stream and request)
class IngestOutcome:
    accepted: list[ReadingIn]
    duplicates: int
    result: BatchResult | None
    opened: list[Alarm]
    closed: list[Alarm]


@dataclass(slots=True)
class _Batch:
    """One stream's part of a request, validated and ready to process."""

    live: LiveStream
    fresh: list[ReadingIn]
    resent: int
    micros: np.ndarray  # (fresh,) int64 microseconds since the epoch
    values: np.ndarray  # (fresh, C)
    references: np.ndarray | None
    restart: np.ndarray
    result: BatchResult | None = None
    tick: _Tick | None = None  # a gateway's tick this batch is row `row` of (see _quick_ticks)
    row: int = 0


@dataclass(frozen=True, slots=True)
class _Tick:
    """The single readings of a request's plain streams as columns, for `advance_tick`."""

    values: np.ndarray  # (N, 1)
    restart: np.ndarray  # (N,)


class StreamEngine:
    """Every stream's live state, rebuilt from the database on first use.

    The database holds every accepted reading and, every `checkpoint_every` readings, a
    checkpoint of the stream's state: loading a stream restores its checkpoint and replays the
    readings accepted after it, in the batches they arrived in, so the state is exactly the one
    the stream had. A request therefore writes its readings and alarm changes, not the state.
    """

    def __init__(
        self,
        database: Database,
        registry: ModelRegistry,
        metrics: Metrics,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        max_future_s: float = 86_400.0,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self.database = database
        self.registry = registry
        self.metrics = metrics
        self.max_gap = max_gap
        self.max_future = timedelta(seconds=max_future_s)
        self.checkpoint_every = checkpoint_every
        self._live: dict[str, LiveStream] = {}
        self._guard = threading.Lock()
        self._stream_locks: dict[str, threading.Lock] = {}
        # One request computes at a time (its streams' forecasts and detectors); its database
        # writes and commit overlap the next one's computing. Two requests computing together
        # share the GIL: each would take twice as long, and the hand-offs cost a quarter more.
        self._computing = threading.Lock()
        self._processors: dict[tuple[str, str, str], StreamProcessor] = {}

    # -- life cycle of a stream's live state --

    def stream_lock(self, stream_id: str) -> threading.Lock:
        """One request at a time per stream (SQLite has no row locks; this is the lock)."""
        with self._guard:
            return self._stream_locks.setdefault(stream_id, threading.Lock())

    @contextmanager
    def _stream_locks_held(self, ids: list[str]) -> Iterator[None]:
        """Every stream's lock, taken in a fixed order (two requests never deadlock)."""
        with self._guard:
            locks = [self._stream_locks.setdefault(i, threading.Lock()) for i in sorted(ids)]
        held: list[threading.Lock] = []
        try:
            for lock in locks:
                lock.acquire()
                held.append(lock)
            yield
        finally:
            for lock in reversed(held):
                lock.release()

    def forget(self, stream_id: str) -> None:
        """Drop the in-memory state (after a reconfiguration, a delete or a failed commit);
        it is rebuilt from the database on demand."""
        with self._guard:
            self._live.pop(stream_id, None)

    def reconfigure(self, session: Session, stream_id: str) -> None:
        """Before a stream's configuration changes: checkpoint its state in `session` (so the
        new detectors start from it, and nothing is replayed under a configuration the readings
        were not processed with), then drop it from memory."""
        with self.stream_lock(stream_id):
            live = self._cached(stream_id)
            if live is not None and live.state.samples:
                self._save_checkpoint(session, live, force=False)
            self.forget(stream_id)

    def processor_for(self, model: RegisteredModel, overrides: dict[str, Any]) -> StreamProcessor:
        """One processor (and monitor configuration) per model and detector overrides, shared
        by every stream configured alike."""
        key = (model.name, model.version, json.dumps(overrides, sort_keys=True))
        with self._guard:
            processor = self._processors.get(key)
        if processor is None:
            processor = StreamProcessor(
                model.forecaster, monitor_config(model, overrides), max_gap=self.max_gap
            )
            with self._guard:
                processor = self._processors.setdefault(key, processor)
        return processor

    def _cached(self, stream_id: str) -> LiveStream | None:
        with self._guard:
            return self._live.get(stream_id)

    def live(self, session: Session, stream: Stream, *, remember: bool = True) -> LiveStream:
        """The stream's live state: from memory, else rebuilt from the database.

        Call it holding the stream's lock: the state it returns moves on in place. Only what
        was read from committed data may be remembered.
        """
        live = self._cached(stream.id)
        if live is not None:
            return live
        model = self.registry.require(stream.model_name)
        processor = self.processor_for(model, stream.detector_overrides)
        checkpoint = checkpoint_repo.get(session, stream.id)
        last_t: datetime | None = None
        if checkpoint is None:
            state = processor.new_state()
            due = 1 + zlib.crc32(stream.id.encode()) % self.checkpoint_every  # staggered
        else:
            if checkpoint.state_version != STATE_VERSION:
                raise DataError(f"stream {stream.id!r} has a checkpoint of another version")
            state = self._restore(processor, json.loads(checkpoint.state))
            last_t = checkpoint.last_t
            due = state.samples + self.checkpoint_every
        live = LiveStream(
            stream_id=stream.id,
            model=model,
            channels=list(stream.channels),
            has_reference=stream.has_reference,
            sample_period_s=stream.sample_period_s,
            processor=processor,
            state=state,
            last_t=last_t,
            checkpoint_due=due,
        )
        self._replay(session, live)
        if not remember:
            return live
        live.series = self.metrics.track_stream(stream.id, live.detectors)
        live.series.thresholds = {
            name: detector.threshold for name, detector in live.state.monitor.detectors.items()
        }
        with self._guard:
            self._live[stream.id] = live
        return live

    def _replay(self, session: Session, live: LiveStream) -> None:
        """Bring a restored state up to the last accepted reading, batch by original batch
        (the forecaster rounds the same way only for the same batches)."""
        stored = reading_repo.batches_from(
            session, stream_id=live.stream_id, first_sample=live.state.samples
        )
        for batch in stored:
            if batch.first_sample != live.state.samples:
                raise DataError(
                    f"stream {live.stream_id!r}: readings from sample {live.state.samples} "
                    "are missing"
                )
            restart = self._restarts(live.last_micro, batch.micros, live.sample_period_s)
            references = batch.references if live.has_reference else None
            live.processor.advance(live.state, batch.values, references, restart)
            live.moved_to(batch.last_t)

    def _restarts(self, last: int | None, micros: np.ndarray, period: float) -> np.ndarray:
        """True where a reading follows the previous one (at `last` microseconds) by more than
        `max_gap` periods."""
        if not len(micros):
            return np.zeros(0, dtype=bool)
        limit = self.max_gap * period
        previous = int(micros[0]) if last is None else last
        if len(micros) == 1:  # a gateway's tick: numpy on one number costs more than Python
            return np.array([(int(micros[0]) - previous) / 1e6 > limit])
        gaps = np.diff(micros, prepend=previous) / 1e6  # exactly timedelta.total_seconds()
        return gaps > limit

    @staticmethod
    def _restore(processor: StreamProcessor, saved: dict[str, Any]) -> StreamState:
        """Resume exactly; if the detectors were reconfigured, keep the window and start the
        detectors afresh (their old state belongs to another configuration)."""
        try:
            return processor.restore(saved)
        except DataError:
            fresh = Monitor(processor.monitor_config).state_dict()
            fresh["sample"] = saved["samples"]
            return processor.restore({**saved, "monitor": fresh})

    def view(self, session: Session, stream: Stream, *, remember: bool = True) -> StreamView:
        """What a read shows, taken under the stream's lock (never a half-applied batch)."""
        with self.stream_lock(stream.id):
            live = self.live(session, stream, remember=remember)
            state = live.state
            return StreamView(
                samples=state.samples,
                last_t=live.last_t,
                warmup_remaining=live.processor.warmup_remaining(state),
                last_forecast=state.last_forecast,
                last_residual=state.last_residual,
                statistics=dict(state.last_statistics),
                thresholds={k: d.threshold for k, d in state.monitor.detectors.items()},
                active={event.detector for event in state.monitor.open_events()},
            )

    def position(self, stream_id: str) -> tuple[int, datetime | None] | None:
        """(readings seen, last time) of a live stream; None if it is not in memory."""
        live = self._cached(stream_id)
        if live is None:
            return None
        with self.stream_lock(stream_id):
            return live.state.samples, live.last_t

    def checkpoint_all(self) -> int:
        """Checkpoint every live stream that moved since its last one (at shutdown: the next
        start replays nothing). Returns how many were written."""
        with self._guard:
            streams = list(self._live.values())
        written = 0
        for live in streams:
            with self.stream_lock(live.stream_id):
                if self._cached(live.stream_id) is not live:
                    continue
                with self.database.session() as session:
                    if self._save_checkpoint(session, live, force=False):
                        written += 1
                live.checkpoint_due = live.state.samples + self.checkpoint_every
        return written

    # -- ingest --

    def ingest(self, stream_id: str, readings: Sequence[ReadingIn]) -> IngestOutcome:
        """Validate, process and durably commit a batch; all or nothing."""
        return self.ingest_many([(stream_id, readings)])[0]

    def ingest_many(
        self, batches: Sequence[tuple[str, Sequence[ReadingIn]]]
    ) -> list[IngestOutcome]:
        """Batches of many streams in one transaction; all or nothing. Streams of one model
        with one reading each are forecast in one batched call."""
        ids = [stream_id for stream_id, _ in batches]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise DataError(
                f"stream(s) {', '.join(twice)} appear more than once: send each stream's "
                "readings as one batch",
                reason="invalid",
            )
        touched: list[str] = []
        with self._stream_locks_held(ids):
            try:
                with self.database.session() as session:
                    with self._computing:
                        lives = self._lives(session, ids)
                        latest = datetime.now(UTC) + self.max_future
                        prepared = self._prepare_all(session, lives, batches, latest)
                        # From here the live states move on in place; on any failure they
                        # are dropped and rebuilt from what the database committed.
                        touched = [batch.live.stream_id for batch in prepared if batch.fresh]
                        self._advance(prepared)
                    outcomes = self._write(session, prepared)
            except BaseException as exc:
                for stream_id in touched:
                    self.forget(stream_id)
                if isinstance(exc, SQLAlchemyError):
                    log.exception("ingest into %s failed; nothing was committed", ", ".join(ids))
                    raise DatabaseError(
                        f"the batch was not stored ({type(exc).__name__}); it is safe to re-send"
                    ) from exc
                raise
            for batch, outcome in zip(prepared, outcomes, strict=True):
                if batch.fresh:
                    batch.live.moved_to(batch.fresh[-1].t, int(batch.micros[-1]))
                    if batch.live.state.samples >= batch.live.checkpoint_due:
                        batch.live.checkpoint_due = batch.live.state.samples + self.checkpoint_every
                self._publish(batch.live, outcome)
        return outcomes

    def _lives(self, session: Session, ids: list[str]) -> list[LiveStream]:
        """The streams' live states; the stream locks (taken by the caller) are the lock.

        No row lock on PostgreSQL: locking 500 rows cost a gateway's request 11 ms of WAL
        writes. Another process writing the same stream (the service runs one) still cannot
        corrupt it: its readings would claim sample numbers already stored, the insert would
        come back short, and the request is refused with 409 and rolled back."""
        with self._guard:
            cached = [self._live.get(stream_id) for stream_id in ids]
        missing = [stream_id for stream_id, live in zip(ids, cached, strict=True) if live is None]
        rows = {row.id: row for row in stream_repo.require_many(session, missing)}
        return [
            live if live is not None else self.live(session, rows[stream_id])
            for stream_id, live in zip(ids, cached, strict=True)
        ]

    def _prepare_all(
        self,
        session: Session,
        lives: list[LiveStream],
        batches: Sequence[tuple[str, Sequence[ReadingIn]]],
        latest: datetime,
    ) -> list[_Batch]:
        """Every stream's part of the request, validated. A gateway's tick (one new reading for
        each of many single-channel streams) is checked with one numpy call per quantity across
        the streams; the rest, and any reading the quick check doubts, take the per-stream path,
        which also words the errors."""
        many = len(batches) > 1
        quick = self._quick_ticks(lives, batches, latest) if many else {}
        return [
            quick.get(index) or self._prepare(session, live, readings, latest, many=many)
            for index, (live, (_, readings)) in enumerate(zip(lives, batches, strict=True))
        ]

    def _quick_ticks(
        self,
        lives: list[LiveStream],
        batches: Sequence[tuple[str, Sequence[ReadingIn]]],
        latest: datetime,
    ) -> dict[int, _Batch]:
        """`_validate` for the request's single new readings of plain streams, by position;
        exactly its checks and results (same time arithmetic on the same microseconds)."""
        rows = [
            index
            for index, (live, (_, readings)) in enumerate(zip(lives, batches, strict=True))
            if len(readings) == 1
            and len(live.channels) == 1
            and not live.has_reference
            and readings[0].values is None
            and readings[0].reference is None
        ]
        if len(rows) < QUICK_TICKS:
            return {}
        readings = [batches[row][1][0] for row in rows]
        micros = reading_repo.micros([reading.t for reading in readings])
        streams = [lives[row] for row in rows]
        never = np.iinfo(np.int64).min
        last = np.array(
            [never if s.last_micro is None else s.last_micro for s in streams],
            dtype=np.int64,
        )
        limits = np.array([self.max_gap * s.sample_period_s for s in streams])
        fresh = (micros > last) & (micros <= reading_repo.micro(latest))
        restart = (last != never) & ((micros - np.where(last == never, 0, last)) / 1e6 > limits)
        values = np.array([reading.value for reading in readings], dtype=np.float64)[:, None]
        tick = _Tick(values, restart)
        # Each stream's one-reading arrays as views, by iterating (cheaper than slicing), and
        # its batch built positionally (a third of the keywords' cost).
        return {
            row: _Batch(live, [reading], 0, micro, value, None, gap, None, tick, k)
            for k, (row, live, reading, ok, micro, value, gap) in enumerate(
                zip(
                    rows,
                    streams,
                    readings,
                    fresh.tolist(),
                    micros[:, None],
                    values[:, None],
                    restart[:, None],
                    strict=True,
                )
            )
            if ok
        }

    def _prepare(
        self,
        session: Session,
        live: LiveStream,
        readings: Sequence[ReadingIn],
        latest: datetime,
        *,
        many: bool,
    ) -> _Batch:
        try:
            return self._validate(session, live, readings, latest)
        except AppError as exc:
            if many:  # say which stream of the request it was
                exc.detail = f"stream {live.stream_id!r}: {exc.detail}"
                exc.extra.setdefault("stream", live.stream_id)
            raise

    def _validate(
        self, session: Session, live: LiveStream, readings: Sequence[ReadingIn], latest: datetime
    ) -> _Batch:
        last_t = live.last_t
        refused: DataError | None = None
        try:
            values = self._values(live, readings)
        except DataError as exc:  # said after the time checks, which come first
            values, refused = np.empty((0, len(live.channels))), exc
        times: list[datetime] | None = None
        resent = 0
        if last_t is not None and readings and readings[0].t <= last_t:
            times = list(map(_TIME, readings))
            resent = bisect.bisect_right(times, last_t)
        processor, state = live.processor, live.state
        check = partial(self._checked, live, readings, values, latest, times, resent)
        pending = None
        if refused is None and processor.can_run_ahead(state, values[resent:]):
            # A long batch's forecasts run here while a helper checks and prepares the rest:
            # the LSTM releases the GIL, so the checks cost the request nothing.
            with suppress(RuntimeError):  # (raised once the interpreter is shutting down)
                pending = helper_pool().submit(check)
            processor.run_ahead(state, values[resent:])
        batch = check(refused) if pending is None else pending.result()
        if resent:
            self._check_resent(session, live, readings[:resent], values[:resent])
        return batch

    def _checked(
        self,
        live: LiveStream,
        readings: Sequence[ReadingIn],
        values: np.ndarray,
        latest: datetime,
        times: list[datetime] | None,
        resent: int,
        refused: DataError | None = None,
    ) -> _Batch:
        """The batch, its times checked first (then `refused`, the values' problem, is raised),
        then its references. Touches neither the database nor the stream: it may run in a
        helper thread."""
        micros = self._checked_times(readings, latest, times)
        if refused is not None:
            raise refused
        references = self._references(live, readings)
        return _Batch(
            live=live,
            fresh=list(readings[resent:]),
            resent=resent,
            micros=micros[resent:],
            values=values[resent:],
            references=None if references is None else references[resent:],
            restart=self._restarts(live.last_micro, micros[resent:], live.sample_period_s),
        )

    def _checked_times(
        self, readings: Sequence[ReadingIn], latest: datetime, times: list[datetime] | None
    ) -> np.ndarray:
        """The readings' times as microseconds, refused unless they increase and stay within
        `max_future` of the server clock."""
        if times is None:
            times = list(map(_TIME, readings))
        micros = reading_repo.micros(times)
        backwards = np.flatnonzero(np.diff(micros) <= 0) if len(times) > 1 else None
        if backwards is not None and len(backwards):
            index = int(backwards[0]) + 1
            raise DataError(
                f"readings[{index}].t ({times[index].isoformat()}) is not after "
                f"readings[{index - 1}].t: send readings in increasing time order",
                reason="invalid",
            )
        if times and times[-1] > latest:
            raise DataError(
                f"readings[{len(times) - 1}].t ({times[-1].isoformat()}) is more than "
                f"{self.max_future.total_seconds():g} s ahead of the server clock: "
                "check the time stamps (seconds, not milliseconds, since the epoch?)",
                reason="invalid",
            )
        return micros

    def _advance(self, batches: list[_Batch]) -> None:
        """Forecast and monitor every batch, grouped by processor (model and detectors)."""
        work = [batch for batch in batches if batch.fresh]
        by_processor: dict[int, list[_Batch]] = {}
        for batch in work:
            by_processor.setdefault(id(batch.live.processor), []).append(batch)
        for group in by_processor.values():
            processor, tick = group[0].live.processor, group[0].tick
            if tick is not None and all(batch.tick is tick for batch in group):
                rows = [batch.row for batch in group]
                results = processor.advance_tick(
                    [batch.live.state for batch in group],
                    tick.values[rows],
                    None,
                    tick.restart[rows],
                )
            else:
                results = processor.advance_many(
                    [(b.live.state, b.values, b.references, b.restart) for b in group]
                )
            for batch, result in zip(group, results, strict=True):
                batch.result = result

    def _write(self, session: Session, batches: list[_Batch]) -> list[IngestOutcome]:
        """The readings, alarm changes and due checkpoints of the advanced batches."""
        stored = [  # (positional: a third of the keywords' cost, and there is one per stream)
            reading_repo.NewBatch(
                batch.live.stream_id,
                batch.result.first_sample,
                batch.micros,
                batch.values,
                batch.references,
            )
            for batch in batches
            if batch.result is not None
        ]
        if reading_repo.insert_batches(session, stored) != len(stored):
            raise ConflictError(
                "a stream received readings from another request meanwhile; re-send the batch",
                reason="conflict",
            )
        outcomes = []
        for batch in batches:
            if batch.result is None:
                outcomes.append(IngestOutcome([], batch.resent, None, [], []))
                continue
            result = batch.result
            opened, closed = (
                self._store_alarms(session, batch)
                if result.opened or result.closed or result.open_events or batch.live.open_peaks
                else ([], [])  # the common case: quiet, nothing open
            )
            if batch.live.state.samples >= batch.live.checkpoint_due:
                self._save_checkpoint(session, batch.live, force=True, last_t=batch.fresh[-1].t)
            outcomes.append(IngestOutcome(batch.fresh, batch.resent, batch.result, opened, closed))
        return outcomes

    def _save_checkpoint(
        self,
        session: Session,
        live: LiveStream,
        *,
        force: bool,
        last_t: datetime | None = None,
    ) -> bool:
        """Write the stream's state (and its row's reading count) unless it is already saved."""
        state = live.state
        last_t = last_t or live.last_t
        if not force:
            saved = checkpoint_repo.get(session, live.stream_id)
            if saved is not None and saved.sample_count == state.samples:
                return False
        checkpoint_repo.save(
            session,
            stream_id=live.stream_id,
            sample_count=state.samples,
            last_t=last_t,
            state=state.to_bytes(),
            state_version=STATE_VERSION,
            now=datetime.now(UTC),
        )
        stream_repo.advance(session, live.stream_id, sample_count=state.samples, last_t=last_t)
        return True

    def _values(self, live: LiveStream, readings: Sequence[ReadingIn]) -> np.ndarray:
        """(N, C) with NaN for nulls; a reading names the stream's channels or nothing else."""
        channels = live.channels
        if len(channels) == 1 and list(map(_VALUES, readings)).count(None) == len(readings):
            # numpy makes None NaN
            return np.array(list(map(_VALUE, readings)), dtype=np.float64).reshape(-1, 1)
        out = np.full((len(readings), len(channels)), np.nan)
        for index, reading in enumerate(readings):
            if reading.values is not None:
                if reading.value is not None:
                    raise DataError(
                        f"readings[{index}] has both 'value' and 'values'", reason="invalid"
                    )
                unknown = sorted(set(reading.values) - set(channels))
                if unknown:
                    raise DataError(
                        f"readings[{index}].values names unknown channel(s) "
                        f"{', '.join(unknown)}; the stream has {', '.join(channels)}",
                        reason="invalid",
                    )
                for column, channel in enumerate(channels):
                    number = reading.values.get(channel)
                    if number is not None:
                        out[index, column] = number
            elif len(channels) > 1:
                raise DataError(
                    f"readings[{index}]: a stream of {len(channels)} channels takes "
                    f"'values': {{{', '.join(repr(c) for c in channels)}: number}}",
                    reason="invalid",
                )
            elif reading.value is not None:
                out[index, 0] = reading.value
        return out

    def _references(self, live: LiveStream, readings: Sequence[ReadingIn]) -> np.ndarray | None:
        given = list(map(_REFERENCE, readings))
        if not live.has_reference:
            if given.count(None) != len(given):
                raise DataError(
                    f"stream {live.stream_id!r} is not configured with has_reference; "
                    "drop 'reference' or reconfigure the stream",
                    reason="invalid",
                )
            return None
        return np.array(given, dtype=np.float64)  # None becomes NaN

    def _check_resent(
        self,
        session: Session,
        live: LiveStream,
        readings: Sequence[ReadingIn],
        values: np.ndarray,
    ) -> None:
        """Readings at or before the last accepted time must be exact re-sends."""
        stored = reading_repo.existing_at(
            session, stream_id=live.stream_id, times=[r.t for r in readings]
        )
        for index, reading in enumerate(readings):
            previous = stored.get(reading.t)
            if previous is None:
                raise ConflictError(
                    f"readings[{index}].t ({reading.t.isoformat()}) is older than the stream's "
                    f"last accepted reading ({live.last_t.isoformat() if live.last_t else '-'})",
                    reason="conflict",
                )
            same = np.array_equal(previous.values, values[index], equal_nan=True)
            if not same or previous.reference != reading.reference:
                raise ConflictError(
                    f"readings[{index}] at {reading.t.isoformat()} was accepted before with "
                    "another value; accepted readings cannot change",
                    reason="conflict",
                )

    def _store_alarms(
        self,
        session: Session,
        batch: _Batch,
    ) -> tuple[list[Alarm], list[Alarm]]:
        """Open and close alarm rows in sample order; refresh the peaks of those still open."""
        live, fresh, result = batch.live, batch.fresh, batch.result
        assert result is not None
        first = result.first_sample

        def time_of(sample: int) -> datetime:
            if sample >= first:
                return fresh[sample - first].t
            stored = reading_repo.time_of(session, stream_id=live.stream_id, sample=sample)
            if stored is None:
                raise DataError(f"no stored reading for sample {sample}")
            return stored

        actions: list[tuple[int, int, AlarmEvent]] = [(e.start, 1, e) for e in result.opened]
        actions += [(e.cleared_at or 0, 0, e) for e in result.closed]
        actions.sort(key=lambda action: (action[0], action[1]))
        opened: list[Alarm] = []
        closed: list[Alarm] = []
        peaks = {event.detector: event.peak for event in result.open_events}
        peaks_moved = peaks != live.open_peaks
        live.open_peaks = peaks  # (a failed commit drops the live state: it is rebuilt)
        if not actions and not peaks_moved:
            return opened, closed  # the common case: no alarm row to touch, no query
        rows: dict[str, Alarm] = {
            alarm.detector: alarm
            for alarm in alarm_repo.list_open(session, stream_id=live.stream_id)
        }
        for sample, is_open, event in actions:
            if is_open:
                if event.detector in rows:  # left open by an earlier configuration
                    closed.append(
                        alarm_repo.close(
                            session,
                            rows.pop(event.detector),
                            closed_at=time_of(sample),
                            closed_sample=sample,
                        )
                    )
                row = alarm_repo.create(
                    session,
                    stream_id=live.stream_id,
                    detector=event.detector,
                    opened_at=time_of(event.start),
                    opened_sample=event.start,
                    peak=event.peak,
                    threshold=event.threshold,
                    model_name=live.model.name,
                    model_version=live.model.version,
                )
                rows[event.detector] = row
                opened.append(row)
            else:
                previous = rows.pop(event.detector, None)
                if previous is None:
                    log.warning("no open alarm row for %s/%s", live.stream_id, event.detector)
                    continue
                closed.append(
                    alarm_repo.close(
                        session,
                        previous,
                        closed_at=time_of(sample),
                        closed_sample=sample,
                        peak=event.peak,
                    )
                )
        for event in result.open_events:
            still_open = rows.get(event.detector)
            if still_open is not None and still_open.peak != event.peak:
                still_open.peak = event.peak
        session.flush()
        return opened, closed

    def _publish(self, live: LiveStream, outcome: IngestOutcome) -> None:
        """Metrics per batch: counts, and the last value of each gauge."""
        series = live.series
        if series is None:
            return
        series.readings += len(outcome.accepted)
        result = outcome.result
        if result is None:
            return
        series.residual = live.state.last_residual
        series.statistics.update(live.state.last_statistics)
        if result.open_events or True in series.active.values():  # (else all stay False)
            open_now = {event.detector for event in result.open_events}
            for detector in series.active:
                series.active[detector] = detector in open_now
        for alarm in outcome.opened:
            series.alarms[alarm.detector] = series.alarms.get(alarm.detector, 0.0) + 1

    # -- reads --

    def forecast(
        self, session: Session, stream: Stream, horizon: int
    ) -> tuple[np.ndarray, datetime | None]:
        """The direct forecast from the stream's current state, and the time it is made after."""
        with self.stream_lock(stream.id):
            live = self.live(session, stream)
            return live.processor.forecast_ahead(live.state, horizon), live.last_t
