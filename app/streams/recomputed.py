"""A stream's stored readings run again through a model, without holding the stream (ingest
goes on meanwhile): a range's forecasts and statistics (`GET .../readings`), a shadow's
comparison and a relearned candidate's proof. `running` is what the stream runs now
(`LiveStreams.model_of`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy.orm import Session

from app.errors import DataError
from app.storage.models import Stream
from app.storage.repositories import readings as reading_repo
from app.streams.blocks import Readings, StreamResult
from app.streams.recurrence import Recurrence
from app.streams.shadow import Run
from app.streams.shadow import run as shadow_run

REWARM_READINGS = 2000
"""The stored readings a stream's new model sees (silently) when it switches to it: enough for
its forecaster's context and its detectors' windows to be what they would have been."""

MOST_RECOMPUTED = 1_000_000
"""Readings replayed at once for a read (`GET .../readings`, a shadow's comparison, a proof): a
longer range is asked for in parts."""

Running = tuple[Recurrence, float, str]
"""What a stream runs: its recurrence, its sample period and its model version."""


def history(
    session: Session,
    stream: Stream,
    running: Running,
    since: datetime | None,
    until: datetime | None,
    *,
    most: int,
) -> History:
    """The stream's stored readings taken in [since, until), with the forecasts, residuals
    and statistics of its current model and thresholds, recomputed: the model first runs
    through up to `REWARM_READINGS` readings before `since` (their statistics and events
    are not part of the answer). A DataError if the range holds more than `most`
    readings. Reads without holding the stream: ingest goes on meanwhile."""
    recurrence, period, version = running
    nothing = History(recurrence, version, np.empty(0, np.int64), None)
    first = 0
    if since is not None:
        found = reading_repo.sample_at_or_after(session, stream_id=stream.id, t=since)
        if found is None:
            return nothing
        first = found
    stop = None
    if until is not None:
        stop = reading_repo.sample_at_or_after(session, stream_id=stream.id, t=until)
    stored = stored_range(session, stream, first, stop, most=most)
    if stored is None:
        return nothing
    state = recurrence.new_state()
    state.samples = stored.start
    period = period if math.isfinite(period) else 1.0  # (learning: no gap restarts it)
    result = recurrence.advance([state], stored.readings, [period]).stream(0)
    times = stored.readings.times[stored.skip :]
    return History(recurrence, version, times, result, stored.skip, stored.readings)


def stored_range(
    session: Session, stream: Stream, first: int, stop: int | None, *, most: int
) -> StoredRange | None:
    """The stream's stored readings from sample `first` to `stop` (by default its last),
    with up to `REWARM_READINGS` before them to warm a model on; None if there are none.
    A DataError, before anything is read, if the range holds more than `most` readings."""
    last = reading_repo.count(session, stream_id=stream.id)
    end = last if stop is None else min(stop, last)
    if end - first > most:
        raise DataError(
            f"the range holds {end - first} readings; at most {most} are recomputed at once: "
            "ask for a shorter range"
        )
    batches = reading_repo.batches_covering(
        session, stream_id=stream.id, first_sample=max(0, first - REWARM_READINGS), stop=end
    )
    if not batches:
        return None
    start = max(batches[0].first_sample, first - REWARM_READINGS)
    readings = joined(batches, has_reference=stream.has_reference, first=start)
    count = max(0, min(readings.times.shape[0], end - start))
    readings = Readings(
        np.array([count]),
        readings.times[:count],
        readings.values[:count],
        None if readings.references is None else readings.references[:count],
    )
    return StoredRange(start, min(count, max(0, first - start)), readings)


def shadowed(
    session: Session, stream: Stream, running: Running, from_sample: int, candidate: Recurrence
) -> Shadowed:
    """What the stream runs and `candidate`, each over its stored readings since
    `from_sample` (the latest `MOST_RECOMPUTED` at most), each warmed on the readings
    before: what a shadow's comparison and a relearned candidate's proof read."""
    active, period, version = running
    total = reading_repo.count(session, stream_id=stream.id)  # (not holding the stream)
    first = max(from_sample, total - MOST_RECOMPUTED)
    stored = stored_range(session, stream, first, None, most=MOST_RECOMPUTED)
    if stored is None or int(stored.readings.counts[0]) <= stored.skip:
        return Shadowed(version, None, None, None)
    current, shadow = (
        shadow_run(recurrence, stored.readings, period, start=stored.start, skip=stored.skip)
        for recurrence in (active, candidate)
    )
    return Shadowed(version, stored, current, shadow)


@dataclass(frozen=True)
class StoredRange:
    """Stored readings of one stream from sample `start`: the first `skip` warm a model up,
    the rest are the range asked for."""

    start: int
    skip: int
    readings: Readings


@dataclass(frozen=True)
class History:
    """What `history` recomputed: the readings' times from the range's first,
    and the replay's result (which begins `skip` readings earlier, in the warm-up)."""

    recurrence: Recurrence
    version: str
    times: np.ndarray
    result: StreamResult | None
    skip: int = 0
    readings: Readings | None = None

    def column(self, values: np.ndarray) -> np.ndarray:
        """A per-reading column of the replay, from the range's first reading."""
        return values[self.skip :]


@dataclass(frozen=True)
class Shadowed:
    """A stream's model (`version`) and a candidate over the same stored readings (None: there
    were none)."""

    version: str
    stored: StoredRange | None
    running: Run | None
    candidate: Run | None


def joined(
    batches: Sequence[reading_repo.StoredBatch], *, has_reference: bool, first: int | None = None
) -> Readings:
    """One stream's consecutive stored batches as one block of readings, from sample `first`
    (by default the first batch's first)."""
    cut = 0 if first is None else first - batches[0].first_sample
    times = np.concatenate([batch.micros for batch in batches])[cut:]
    references = None
    if has_reference:
        references = np.concatenate([batch.references_or_nan for batch in batches])[cut:]
    return Readings(
        np.array([times.shape[0]]),
        times,
        np.concatenate([batch.values for batch in batches])[cut:],
        references,
    )
