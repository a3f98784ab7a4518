"""The live engine: each stream's state in memory, and the ingest unit of work around it.

A readings request is one transaction: the new readings, every alarm they open or close and the
stream's checkpoint are committed together, and only then does the in-memory state move on. If
anything fails, the transaction rolls back and the stream is exactly as it was, so a client can
re-send the batch. Re-sent readings (same time, same value) are recognised and not processed
twice; one stream is processed by one request at a time.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.errors import ArtifactError, ConflictError, DataError
from app.metrics import Metrics
from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.monitor import Monitor, MonitorConfig
from app.registry import ModelRegistry, RegisteredModel
from app.schemas import ReadingIn
from app.storage.db import Database, DatabaseError
from app.storage.models import Alarm, Reading, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.processor import (
    DEFAULT_MAX_GAP,
    STATE_VERSION,
    BatchResult,
    StreamProcessor,
    StreamState,
)

log = logging.getLogger(__name__)


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

    @property
    def detectors(self) -> list[str]:
        return list(self.state.monitor.detectors)


@dataclass(frozen=True)
class IngestOutcome:
    accepted: list[ReadingIn]
    duplicates: int
    result: BatchResult | None
    opened: list[Alarm]
    closed: list[Alarm]


class StreamEngine:
    """Every stream's live state, loaded from its checkpoint on first use."""

    def __init__(
        self,
        database: Database,
        registry: ModelRegistry,
        metrics: Metrics,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        max_future_s: float = 86_400.0,
    ) -> None:
        self.database = database
        self.registry = registry
        self.metrics = metrics
        self.max_gap = max_gap
        self.max_future = timedelta(seconds=max_future_s)
        self._live: dict[str, LiveStream] = {}
        self._guard = threading.Lock()
        self._stream_locks: dict[str, threading.Lock] = {}

    # -- life cycle of a stream's live state --

    def stream_lock(self, stream_id: str) -> threading.Lock:
        """One request at a time per stream (SQLite has no row locks; this is the lock)."""
        with self._guard:
            return self._stream_locks.setdefault(stream_id, threading.Lock())

    def forget(self, stream_id: str) -> None:
        """Drop the in-memory state (after a reconfiguration or a delete); reloaded on demand."""
        with self._guard:
            self._live.pop(stream_id, None)

    def processor_for(self, model: RegisteredModel, overrides: dict[str, Any]) -> StreamProcessor:
        return StreamProcessor(
            model.forecaster, monitor_config(model, overrides), max_gap=self.max_gap
        )

    def _cached(self, stream_id: str) -> LiveStream | None:
        with self._guard:
            return self._live.get(stream_id)

    def live(self, session: Session, stream: Stream, *, remember: bool = True) -> LiveStream:
        """The stream's live state: from memory, else from its checkpoint, else fresh.

        Only ingest, holding the stream's lock, may `remember` what it loaded: a read that
        cached a checkpoint it loaded while a batch was committing would leave a stale state
        that refuses every later batch.
        """
        live = self._cached(stream.id)
        if live is not None:
            return live
        model = self.registry.require(stream.model_name)
        processor = self.processor_for(model, stream.detector_overrides)
        checkpoint = checkpoint_repo.get(session, stream.id)
        if checkpoint is None:
            state = processor.new_state()
        else:
            if checkpoint.state_version != STATE_VERSION:
                raise DataError(f"stream {stream.id!r} has a checkpoint of another version")
            saved = json.loads(checkpoint.state)
            state = self._restore(processor, saved)
        live = LiveStream(
            stream_id=stream.id,
            model=model,
            channels=list(stream.channels),
            has_reference=stream.has_reference,
            sample_period_s=stream.sample_period_s,
            processor=processor,
            state=state,
            last_t=stream.last_t,
        )
        if not remember:
            return live
        self.metrics.track_stream(stream.id, detectors=live.detectors)
        for name, detector in live.state.monitor.detectors.items():
            self.metrics.detector_threshold.labels(stream=stream.id, detector=name).set(
                detector.threshold
            )
        with self._guard:
            self._live[stream.id] = live
        return live

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

    # -- ingest --

    def ingest(self, stream_id: str, readings: Sequence[ReadingIn]) -> IngestOutcome:
        """Validate, process and durably commit a batch; all or nothing."""
        with self.stream_lock(stream_id):
            try:
                with self.database.session() as session:
                    live = self._cached(stream_id)
                    if live is None or self.database.dialect == "postgresql":
                        # PostgreSQL: the row lock also keeps out another process. SQLite has
                        # no row locks; the stream lock above is the lock there.
                        stream = stream_repo.require(session, stream_id, for_update=True)
                        live = live or self.live(session, stream)
                    outcome, new_state = self._ingest(session, live, readings)
            except SQLAlchemyError as exc:
                log.exception("ingest into %s failed; nothing was committed", stream_id)
                raise DatabaseError(
                    f"the batch was not stored ({type(exc).__name__}); it is safe to re-send"
                ) from exc
            # Committed: only now does the live state move on.
            if new_state is not None and outcome.accepted:
                live.state = new_state
                live.last_t = outcome.accepted[-1].t
                self._publish(live, outcome)
            return outcome

    def _ingest(
        self, session: Session, live: LiveStream, readings: Sequence[ReadingIn]
    ) -> tuple[IngestOutcome, StreamState | None]:
        times = [reading.t for reading in readings]
        for index in range(1, len(times)):
            if times[index] <= times[index - 1]:
                raise DataError(
                    f"readings[{index}].t ({times[index].isoformat()}) is not after "
                    f"readings[{index - 1}].t: send readings in increasing time order",
                    reason="invalid",
                )
        if times and times[-1] > datetime.now(UTC) + self.max_future:
            raise DataError(
                f"readings[{len(times) - 1}].t ({times[-1].isoformat()}) is more than "
                f"{self.max_future.total_seconds():g} s ahead of the server clock: "
                "check the time stamps (seconds, not milliseconds, since the epoch?)",
                reason="invalid",
            )
        values = self._values(live, readings)
        references = self._references(live, readings)
        last_t = live.last_t
        resent = 0 if last_t is None else sum(1 for t in times if t <= last_t)
        if resent:
            self._check_resent(session, live, readings[:resent], values[:resent])
        fresh = list(readings[resent:])
        if not fresh:
            return IngestOutcome([], resent, None, [], []), None

        period = live.sample_period_s
        gap_limit = self.max_gap * period
        restart = np.zeros(len(fresh), dtype=bool)
        previous = last_t
        for index, reading in enumerate(fresh):
            if previous is not None and (reading.t - previous).total_seconds() > gap_limit:
                restart[index] = True
            previous = reading.t
        new_state, result = live.processor.process(
            live.state,
            values[resent:],
            None if references is None else references[resent:],
            restart,
        )
        first = live.state.samples
        inserted = reading_repo.insert_batch(
            session,
            stream_id=live.stream_id,
            readings=[
                reading_repo.NewReading(
                    sample=first + index,
                    t=reading.t,
                    value=reading.value if reading.values is None else None,
                    values=None if reading.values is None else dict(reading.values),
                    reference=reading.reference,
                )
                for index, reading in enumerate(fresh)
            ],
        )
        if inserted != len(fresh):
            raise ConflictError(
                f"stream {live.stream_id!r} received readings from another request meanwhile; "
                "re-send the batch",
                reason="conflict",
            )
        opened, closed = self._store_alarms(session, live, fresh, first, result)
        checkpoint_repo.save(
            session,
            stream_id=live.stream_id,
            sample_count=new_state.samples,
            last_t=fresh[-1].t,
            state=json.dumps(new_state.to_json(), allow_nan=False).encode(),
            state_version=STATE_VERSION,
            now=datetime.now(UTC),
        )
        stream_repo.advance(
            session, live.stream_id, sample_count=new_state.samples, last_t=fresh[-1].t
        )
        return IngestOutcome(fresh, resent, result, opened, closed), new_state

    def _values(self, live: LiveStream, readings: Sequence[ReadingIn]) -> np.ndarray:
        """(N, C) with NaN for nulls; a reading names the stream's channels or nothing else."""
        channels = live.channels
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
        given = [reading.reference for reading in readings]
        if not live.has_reference:
            if any(reference is not None for reference in given):
                raise DataError(
                    f"stream {live.stream_id!r} is not configured with has_reference; "
                    "drop 'reference' or reconfigure the stream",
                    reason="invalid",
                )
            return None
        return np.array([math.nan if r is None else r for r in given], dtype=np.float64)

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
            if not _same_reading(previous, live.channels, values[index], reading.reference):
                raise ConflictError(
                    f"readings[{index}] at {reading.t.isoformat()} was accepted before with "
                    "another value; accepted readings cannot change",
                    reason="conflict",
                )

    def _store_alarms(
        self,
        session: Session,
        live: LiveStream,
        fresh: Sequence[ReadingIn],
        first: int,
        result: BatchResult,
    ) -> tuple[list[Alarm], list[Alarm]]:
        """Open and close alarm rows in sample order; refresh the peaks of those still open."""

        def time_of(sample: int) -> datetime:
            if sample >= first:
                return fresh[sample - first].t
            stored = reading_repo.by_sample(
                session, stream_id=live.stream_id, start=sample, stop=sample + 1
            )
            if not stored:
                raise DataError(f"no stored reading for sample {sample}")
            return stored[0].t

        actions: list[tuple[int, int, AlarmEvent]] = [(e.start, 1, e) for e in result.opened]
        actions += [(e.cleared_at or 0, 0, e) for e in result.closed]
        actions.sort(key=lambda action: (action[0], action[1]))
        opened: list[Alarm] = []
        closed: list[Alarm] = []
        peaks_before = {e.detector: e.peak for e in live.state.monitor.open_events()}
        peaks_moved = any(peaks_before.get(e.detector) != e.peak for e in result.open_events)
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
        metrics = self.metrics
        stream_id = live.stream_id
        metrics.readings.labels(stream=stream_id).inc(len(outcome.accepted))
        result = outcome.result
        if result is None:
            return
        if live.state.last_residual is not None:
            metrics.residual.labels(stream=stream_id).set(live.state.last_residual)
        for detector, statistic in live.state.last_statistics.items():
            metrics.detector_statistic.labels(stream=stream_id, detector=detector).set(statistic)
        open_now = {event.detector for event in result.open_events}
        for detector in live.detectors:
            metrics.alarm_active.labels(stream=stream_id, detector=detector).set(
                1.0 if detector in open_now else 0.0
            )
        for alarm in outcome.opened:
            metrics.alarms.labels(stream=stream_id, detector=alarm.detector).inc()

    # -- reads --

    def forecast(self, session: Session, stream: Stream, horizon: int) -> np.ndarray:
        live = self.live(session, stream, remember=False)
        return live.processor.forecast_ahead(live.state, horizon)


def _same_reading(
    stored: Reading, channels: list[str], values: np.ndarray, reference: float | None
) -> bool:
    if stored.values is not None:
        previous = np.array(
            [math.nan if stored.values.get(c) is None else stored.values[c] for c in channels]
        )
    else:
        previous = np.array([math.nan if stored.value is None else stored.value])
    same_values = bool(np.array_equal(previous, values, equal_nan=True))
    return same_values and stored.reference == reference
