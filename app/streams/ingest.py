"""Ingest: a request's readings checked, run through their streams' recurrence and stored with the
alarms they open or close, in the caller's transaction.

All or nothing: the readings, the alarm rows and any due checkpoint are written in the session
the caller commits; only if it commits do the streams' new states count (see `LiveStreams`).
A re-sent reading (same time, same values) is recognised and not processed twice, so a client
can always re-send a batch it has no answer for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
from sqlalchemy.orm import Session

from app.errors import ConflictError, DataError
from app.metrics import Metrics
from app.monitoring.alarms import AlarmEvent
from app.storage.models import Alarm
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import readings as reading_repo
from app.streams.blocks import Readings, StreamResult
from app.streams.held import LiveStream
from app.streams.live import LiveStreams
from app.streams.recurrence import Recurrence

VALUE = None
"""The column of readings sent as a single `value`: channel 0 of a one-channel stream."""


@dataclass(frozen=True)
class NewReadings:
    """A request's readings of one or more streams, stream after stream, as plain arrays.

    `values` has a column per name in `columns` (`VALUE` for readings sent as a single value),
    NaN where a reading has no number; `references` is None when no reading carries one."""

    streams: list[str]
    counts: np.ndarray  # (N,) readings per stream
    times: np.ndarray  # (R,) int64 microseconds since the epoch
    values: np.ndarray  # (R, K)
    columns: tuple[str | None, ...]
    references: np.ndarray | None  # (R,), NaN where a reading has none


@dataclass
class IngestOutcome:
    """What one stream's part of a request did."""

    stream_id: str
    times: np.ndarray  # the accepted readings' times (microseconds)
    duplicates: int
    result: StreamResult | None  # None when every reading was a re-send
    opened: list[Alarm]
    closed: list[Alarm]
    incidents_opened: int = 0
    incidents_closed: int = 0
    new_alarms: list[str] = field(default_factory=list)  # detectors of new (not re-opened) ones

    @property
    def accepted(self) -> int:
        return len(self.times)


@dataclass
class _Part:
    """One stream's readings of the request, checked."""

    live: LiveStream
    first: int  # where its readings start in the request's arrays
    resent: int  # how many of them are re-sends
    stop: int
    values: np.ndarray  # (readings, C) in the stream's channel order
    references: np.ndarray | None


def ingest(
    session: Session,
    streams: LiveStreams,
    metrics: Metrics,
    new: NewReadings,
    *,
    max_future_s: float,
) -> list[IngestOutcome]:
    """Check, process and store the readings in `session`; NotFoundError for an unknown stream,
    DataError (422) for bad readings, ConflictError (409) for readings older than a stream's
    last one or changing an accepted one: nothing changes then."""
    ids = new.streams
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise DataError(
            f"stream(s) {', '.join(twice)} appear more than once: send each stream's readings "
            "as one batch",
            reason="invalid",
        )
    lives = streams.hold(session, ids)
    parts = _check(session, lives, new, max_future_s)
    touched = [part.live.stream_id for part in parts if part.stop > part.first + part.resent]

    def drop_touched() -> None:  # restored from what was committed on their next touch
        for stream_id in touched:
            streams.forget(stream_id)

    streams.on_end(session, rollback=drop_touched)
    results = _advance(parts, new)
    learned_enough = _learning(parts, results, new)
    outcomes, left_open = _store(session, streams, parts, results, new)

    def committed() -> None:
        _committed(streams, metrics, parts, outcomes, left_open)
        for live in learned_enough:
            streams.learn_if_due(live)
        for part in parts:
            if part.live.learned is not None:  # (a revision, a relearning, a proof)
                streams.learn_if_due(part.live)

    streams.on_end(session, commit=committed)
    return outcomes


def _check(
    session: Session, lives: list[LiveStream], new: NewReadings, max_future_s: float
) -> list[_Part]:
    """Each stream's readings checked, in the stream's channel order; the first problem is
    raised (naming the stream when the request has several). The checks of times run over the
    whole request at once; a stream's own work is a slice unless something is wrong with it."""
    offsets = np.concatenate(([0], np.cumsum(new.counts))).tolist()
    times = new.times
    latest = reading_repo.micro(datetime.now(UTC)) + int(max_future_s * 1e6)
    late = set(np.flatnonzero(times > latest).tolist())
    # Times increase within each stream: a step back is a problem unless it starts a stream.
    backwards = set((np.flatnonzero(np.diff(times) <= 0) + 1).tolist()).difference(offsets)
    firsts = times[np.minimum(offsets[:-1], len(times) - 1)].tolist() if len(times) else []
    parts = []
    for index, live in enumerate(lives):
        first, stop = offsets[index], offsets[index + 1]
        try:
            if (backwards or late) and (
                backwards.intersection(range(first, stop)) or late.intersection(range(first, stop))
            ):
                _refuse_times(new, first, stop, backwards, late, max_future_s)
            values = _channels(live, new, first, stop)
            references = _references(live, new, first, stop)
            last = live.state.last_time
            resent = 0
            if last is not None and first < stop and firsts[index] <= last:
                resent = int(np.searchsorted(times[first:stop], last, side="right"))
                _check_resent(session, live, times[first : first + resent], values, references)
        except (DataError, ConflictError) as exc:
            if len(lives) > 1:
                exc.detail = f"stream {live.stream_id!r}: {exc.detail}"
                exc.args = (exc.detail,)
                exc.extra.setdefault("stream", live.stream_id)
            raise
        parts.append(_Part(live, first, resent, stop, values, references))
    return parts


def _refuse_times(
    new: NewReadings,
    first: int,
    stop: int,
    backwards: set[int],
    late: set[int],
    max_future_s: float,
) -> None:
    """The problem with a stream's times: the first step back, else its latest reading from the
    future."""

    def at(position: int) -> str:
        return reading_repo.datetime_at(int(new.times[position])).isoformat()

    for position in sorted(backwards.intersection(range(first, stop)))[:1]:
        raise DataError(
            f"readings[{position - first}].t ({at(position)}) is not after "
            f"readings[{position - first - 1}].t: send readings in increasing time order",
            reason="invalid",
        )
    for position in sorted(late.intersection(range(first, stop)))[-1:]:
        raise DataError(
            f"readings[{position - first}].t ({at(position)}) is more than {max_future_s:g} s "
            "ahead of the server clock: check the time stamps (seconds, not milliseconds, "
            "since the epoch?)",
            reason="invalid",
        )


def _references(live: LiveStream, new: NewReadings, first: int, stop: int) -> np.ndarray | None:
    """The stream's references (NaN: none), or None for a stream without a reference sensor."""
    given = None if new.references is None else new.references[first:stop]
    if not live.has_reference:
        if given is not None and not np.isnan(given).all():
            raise DataError(
                f"stream {live.stream_id!r} is not configured with has_reference; "
                "drop 'reference' or reconfigure the stream",
                reason="invalid",
            )
        return None
    return np.full(stop - first, np.nan) if given is None else given


def _channels(live: LiveStream, new: NewReadings, first: int, stop: int) -> np.ndarray:
    """The readings' numbers in the stream's channel order, (readings, C)."""
    channels = live.channels
    if new.columns == (VALUE,) and len(channels) == 1:  # a plain stream's plain readings
        return new.values[first:stop]
    out = np.full((stop - first, len(channels)), np.nan)
    for column, name in enumerate(new.columns):
        given = new.values[first:stop, column]
        if name is VALUE:
            if len(channels) > 1 and not np.isnan(given).all():
                index = int(np.flatnonzero(~np.isnan(given))[0])
                raise DataError(
                    f"readings[{index}]: a stream of {len(channels)} channels takes 'values': "
                    f"{{{', '.join(repr(c) for c in channels)}: number}}",
                    reason="invalid",
                )
            target = 0
        elif name in channels:
            target = channels.index(name)
        else:
            if np.isnan(given).all():
                continue  # named by another stream of the request
            index = int(np.flatnonzero(~np.isnan(given))[0])
            raise DataError(
                f"readings[{index}].values names unknown channel(s) {name}; the stream has "
                f"{', '.join(channels)}",
                reason="invalid",
            )
        out[:, target] = np.where(np.isnan(given), out[:, target], given)
    return out


def _check_resent(
    session: Session,
    live: LiveStream,
    times: np.ndarray,
    values: np.ndarray,
    references: np.ndarray | None,
) -> None:
    """Readings at or before the stream's last accepted time must be exact re-sends."""
    moments = [reading_repo.datetime_at(t) for t in times.tolist()]
    stored = reading_repo.existing_at(session, stream_id=live.stream_id, times=moments)
    last = reading_repo.datetime_at(live.state.last_time or 0).isoformat()
    for index, moment in enumerate(moments):
        previous = stored.get(moment)
        if previous is None:
            raise ConflictError(
                f"readings[{index}].t ({moment.isoformat()}) is older than the stream's last "
                f"accepted reading ({last})",
                reason="conflict",
            )
        reference = None if references is None else float(references[index])
        same_reference = (
            previous.reference is None and (reference is None or reference != reference)
        ) or (previous.reference == reference)
        if not np.array_equal(previous.values, values[index], equal_nan=True) or not same_reference:
            raise ConflictError(
                f"readings[{index}] at {moment.isoformat()} was accepted before with another "
                "value; accepted readings cannot change",
                reason="conflict",
            )


def _advance(parts: list[_Part], new: NewReadings) -> list[StreamResult | None]:
    """Every stream's new readings through its recurrence: one block per recurrence."""
    groups: dict[int, tuple[Recurrence, list[int]]] = {}
    for index, part in enumerate(parts):
        if part.stop > part.first + part.resent:
            recurrence = part.live.recurrence
            groups.setdefault(id(recurrence), (recurrence, []))[1].append(index)
    results: list[StreamResult | None] = [None] * len(parts)
    for recurrence, members in groups.values():
        chosen = [parts[i] for i in members]
        readings = _block(chosen, new) if len(chosen) < len(parts) else _whole(parts, new)
        block = recurrence.advance(
            [part.live.state for part in chosen],
            readings,
            [part.live.sample_period_s for part in chosen],
        )
        for position, index in enumerate(members):
            results[index] = block.stream(position)
    return results


def _learning(
    parts: list[_Part], results: list[StreamResult | None], new: NewReadings
) -> list[LiveStream]:
    """Learning streams: which have all their learning readings with this request, and only
    the events of their learning period kept (the learned model decides about the rest)."""
    ended = []
    for part, result in zip(parts, results, strict=True):
        learning = part.live.learning
        if learning is None or result is None:
            continue
        times = new.times[part.first + part.resent : part.stop]
        if learning.observe(result.first_sample, times):
            ended.append(part.live)
        if learning.end is not None:
            result.opened = [e for e in result.opened if learning.events_kept(e.start)]
            result.closed = [
                e for e in result.closed if learning.events_kept(e.cleared_at or e.start)
            ]
    return ended


def _whole(parts: list[_Part], new: NewReadings) -> Readings:
    """The request's readings as they came, when every stream is in the block and nothing is
    re-sent (a gateway's tick, a stream's batch): no copy."""
    plain = new.columns == (VALUE,) and all(part.values.shape[1] == 1 for part in parts)
    if not plain or any(part.resent for part in parts):
        return _block(parts, new)
    referenced = [part.references is not None for part in parts]
    if any(referenced) and not all(referenced):
        return _block(parts, new)
    references = None
    if all(referenced) and parts:
        references = (
            new.references if new.references is not None else np.full(len(new.times), np.nan)
        )
    return Readings(new.counts, new.times, new.values, references)


def _block(chosen: list[_Part], new: NewReadings) -> Readings:
    """The new readings of `chosen`, stream after stream."""
    with_reference = any(part.references is not None for part in chosen)
    return Readings(
        np.array([part.stop - part.first - part.resent for part in chosen]),
        np.concatenate([new.times[part.first + part.resent : part.stop] for part in chosen]),
        np.concatenate([part.values[part.resent :] for part in chosen]),
        np.concatenate(
            [
                part.references[part.resent :]
                if part.references is not None
                else np.full(part.stop - part.first - part.resent, np.nan)
                for part in chosen
            ]
        )
        if with_reference
        else None,
    )


def _store(
    session: Session,
    streams: LiveStreams,
    parts: list[_Part],
    results: list[StreamResult | None],
    new: NewReadings,
) -> tuple[list[IngestOutcome], list[dict[str, float] | None]]:
    """The readings, the alarm changes and the due checkpoints of the advanced streams; and
    the peak of each alarm left open, by stream (None: the stream did not move)."""
    stored = [
        reading_repo.NewBatch(
            part.live.stream_id,
            result.first_sample,
            new.times[part.first + part.resent : part.stop],
            part.values[part.resent :],
            None if part.references is None else part.references[part.resent :],
        )
        for part, result in zip(parts, results, strict=True)
        if result is not None
    ]
    if reading_repo.insert_batches(session, stored) != len(stored):
        raise ConflictError(
            "a stream received readings from another request meanwhile; re-send the batch",
            reason="conflict",
        )
    moved = [  # the streams whose alarms open or close: their open alarms read together
        part.live.stream_id
        for part, result in zip(parts, results, strict=True)
        if result is not None
        and (result.opened or result.closed or part.live.stale_since is not None)
    ]
    known = alarm_repo.OpenAlarms.read(session, moved) if moved else None
    outcomes: list[IngestOutcome] = []
    left_open: list[dict[str, float] | None] = []
    for part, result in zip(parts, results, strict=True):
        times = new.times[part.first + part.resent : part.stop]
        applied = alarm_repo.Applied([], [])
        peaks = None
        if result is not None:
            live = part.live
            open_events = live.recurrence.monitor.open_events(live.state.monitor)
            peaks = {event.detector: event.peak for event in open_events}
            closed_events = result.closed
            if live.stale_since is not None:  # a reading at last: the stale alarm closes
                first = result.first_sample
                stale = AlarmEvent("stale", live.stale_since, first, 0.0, 0.0, cleared_at=first)
                closed_events = [stale, *closed_events]
            if live.learning is not None and live.learning.end is not None:
                peaks = live.open_peaks  # past the learning period: left for the learned model
            if result.opened or closed_events or peaks != live.open_peaks:
                applied = alarm_repo.apply(
                    session,
                    stream_id=live.stream_id,
                    opened=result.opened,
                    closed=closed_events,
                    peaks=peaks,
                    time_of=_times(session, live, result, times),
                    model_name=live.model_name,
                    model_version=live.model_version,
                    channels=live.channels,
                    open_alarms=None if known is None else known.by_stream.get(live.stream_id),
                )
            if live.state.samples >= live.checkpoint_due:
                streams.checkpoint(session, live, force=True)
        outcomes.append(
            IngestOutcome(
                part.live.stream_id,
                times,
                part.resent,
                result,
                applied.opened,
                applied.closed,
                applied.incidents_opened,
                applied.incidents_closed,
                [alarm.detector for alarm in applied.new],
            )
        )
        left_open.append(peaks)
    return outcomes, left_open


def _times(
    session: Session, live: LiveStream, result: StreamResult, times: np.ndarray
) -> Callable[[int], datetime]:
    """When each sample an event names was read (from this batch, else from the database)."""

    def time_of(sample: int) -> datetime:
        if sample >= result.first_sample:
            return reading_repo.datetime_at(int(times[sample - result.first_sample]))
        stored = reading_repo.time_of(session, stream_id=live.stream_id, sample=sample)
        if stored is None:
            raise DataError(f"no stored reading for sample {sample}")
        return stored

    return time_of


def _committed(
    streams: LiveStreams,
    metrics: Metrics,
    parts: list[_Part],
    outcomes: list[IngestOutcome],
    peaks: list[dict[str, float] | None],
) -> None:
    """Once committed: the streams' next checkpoints are due later, and metrics move."""
    for part, outcome, open_peaks in zip(parts, outcomes, peaks, strict=True):
        live = part.live
        if outcome.result is None or open_peaks is None:
            continue
        if live.state.samples >= live.checkpoint_due:
            live.checkpoint_due = streams.next_checkpoint(live.stream_id, live.state.samples)
        live.open_peaks = open_peaks
        live.last_arrival, live.stale_since = time.monotonic(), None
        metrics.publish(
            live.stream_id,
            readings=outcome.accepted,
            latest=live.state.latest,
            kinds=live.recurrence.monitor.kinds_tuple,
            targets=live.recurrence.targets,
            active=set(open_peaks),
            opened=outcome.new_alarms,
            incidents_opened=outcome.incidents_opened,
            incidents_closed=outcome.incidents_closed,
        )
