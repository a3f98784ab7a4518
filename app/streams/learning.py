"""A learning stream: the phase before its model exists, and the replay its model runs.

A stream of model "auto" starts learning: its readings are stored and acknowledged, and only
data-quality detectors watch them (a missing-readings rule; there is no forecast yet). Once it
has its learning readings (`{"readings": n}`, or `{"duration_s": s}` of them and at least
`MIN_READINGS`), the learner (app/streams/learner.py) fits its model in a background thread,
off every request (`app.learning.learn`): a job of kind `learn`, as each later revision of its
thresholds is one of kind `revise` (`GET /v1/jobs` lists them beside the jobs users ask for).
They run in the service's own thread, not in a process as those do: a fit of the linear models
is small beside starting a process, and a fleet's streams fit one after another. Each makes a
version of the stream's learned models, which the stream runs at once.

Readings that arrive during the fit are stored as usual; once the model is there,
`handover.adopt` runs every stored reading through the learned recurrence, in order: the
learning readings silently (they are what normal looks like), the later ones raising their
alarms. None is lost or skipped, and a restart in the middle simply fits again.

The learning phase keeps its alarms only for readings before the end of the learning period:
from there on the learned model's monitor decides.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.forecasting.lagged import ChannelFit, LaggedLinear
from app.learning.adapt import next_revision, revise
from app.learning.learn import DEFAULT_LEARNING_READINGS, MIN_READINGS, LearnedModel
from app.monitoring.alarms import AlarmEvent
from app.monitoring.config import MISSING_READINGS, MonitorConfig
from app.monitoring.incidents import alarm_spans
from app.streams.blocks import Readings, StreamState
from app.streams.recurrence import DEFAULT_MAX_GAP, Recurrence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearningPlan:
    """How long a stream learns: `readings` readings, or the readings of `duration_s` seconds
    (and at least MIN_READINGS)."""

    readings: int | None = None
    duration_s: float | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> LearningPlan:
        if not raw:
            return cls(readings=DEFAULT_LEARNING_READINGS)
        readings, duration = raw.get("readings"), raw.get("duration_s")
        return cls(
            readings=None if readings is None else int(readings),
            duration_s=None if duration is None else float(duration),
        )

    def end(
        self, times: np.ndarray, *, first_sample: int = 0, first_time: int | None = None
    ) -> int | None:
        """Where learning ends, given the times of a stream's readings from sample
        `first_sample` on (by default all of them) and its first reading's time (by default
        the first of `times`): the number of learning readings, or None if they are not all
        there yet."""
        seen = first_sample + times.shape[0]
        if self.readings is not None:
            return self.readings if seen >= self.readings else None
        assert self.duration_s is not None
        if not times.shape[0] or seen < MIN_READINGS:
            return None
        start = int(times[0]) if first_time is None else first_time
        until = start + round(self.duration_s * 1e6)
        if times[-1] < until:
            return None
        before = first_sample + int(np.searchsorted(times, until, side="left"))
        return max(before, MIN_READINGS)

    def remaining(self, samples: int, first_time: int | None, last_time: int | None) -> int:
        """Readings still to come before learning ends (for a duration: an estimate from the
        readings' rate so far; at least what MIN_READINGS still asks)."""
        if self.readings is not None:
            return max(0, self.readings - samples)
        assert self.duration_s is not None
        floor = max(0, MIN_READINGS - samples)
        if first_time is None or last_time is None or samples < 2 or last_time <= first_time:
            return max(floor, 1)
        rate = (samples - 1) / ((last_time - first_time) / 1e6)
        left = self.duration_s - (last_time - first_time) / 1e6
        return max(floor, math.ceil(left * rate) if left > 0 else 0)


_RECURRENCES: dict[int, Recurrence] = {}
_GUARD = threading.Lock()


def learning_recurrence(channels: int) -> Recurrence:
    """The recurrence of a stream that is still learning: no forecast (NaN), the missing-
    readings rule only. Shared by every learning stream of `channels` channels."""
    with _GUARD:
        recurrence = _RECURRENCES.get(channels)
        if recurrence is None:
            nothing = ChannelFit("level", (), (), math.nan, 0.0, math.nan, math.nan)
            recurrence = _RECURRENCES[channels] = Recurrence(
                LaggedLinear([nothing] * channels),
                MonitorConfig(channels=channels, detectors=[MISSING_READINGS]),
                max_gap=DEFAULT_MAX_GAP,
            )
        return recurrence


@dataclass
class Learning:
    """A learning stream's progress, as `LiveStream.learning` holds it."""

    plan: LearningPlan
    first_time: int | None  # its first reading's time (microseconds), None before it has one
    end: int | None = None  # the learning readings' count, once they are all there
    error: str | None = None  # why the last fit failed

    def observe(self, first_sample: int, times: np.ndarray) -> bool:
        """Take a batch of new readings (the stream's samples from `first_sample`, their times):
        True if the learning period ends with it."""
        if self.end is not None or not times.shape[0]:
            return False
        if self.first_time is None:
            self.first_time = int(times[0])
        self.end = self.plan.end(times, first_sample=first_sample, first_time=self.first_time)
        return self.end is not None

    def events_kept(self, sample: int) -> bool:
        """Whether the learning phase's monitor decides about an event at `sample`."""
        return self.end is None or sample < self.end


@dataclass
class Replayed:
    """The events a replay raised (from the sample it was asked for)."""

    opened: list[AlarmEvent] = field(default_factory=list)
    closed: list[AlarmEvent] = field(default_factory=list)


def replay(
    recurrence: Recurrence,
    state: StreamState,
    readings: Readings,
    period: float,
    *,
    quiet_until: int | None = None,
    events_from: int | None = None,
    revisions: Sequence[tuple[int, Recurrence]] = (),
) -> Replayed:
    """Advance one stream by its readings (one stream's, in order). Readings before sample
    `quiet_until` (a learned stream's learning period) raise nothing: its rules are reset after
    them. `revisions`: from which sample on the stream's thresholds were revised, and the
    recurrence with them (`recurrence` before the first). Returns the events raised from sample
    `events_from` on (none without it). Pure: the restore after a restart, the switch to a
    learned model and the benchmark all run it."""
    replayed = Replayed()
    total = int(readings.counts[0])
    first = state.samples
    marks = [quiet_until] if quiet_until is not None else []
    marks += [start for start, _ in revisions]
    cuts = sorted({0, total, *(m - first for m in marks if first < m < first + total)})
    for start, stop in itertools.pairwise(cuts):
        part = readings.part(start, stop)
        current = recurrence
        for begins, revised in revisions:
            if begins <= first + start:
                current = revised
        result = current.advance([state], part, [period]).stream(0)
        if quiet_until is not None and state.samples <= quiet_until:
            current.monitor.quiet(state.monitor)
        elif events_from is not None:
            replayed.opened += [e for e in result.opened if e.start >= events_from]
            replayed.closed += [e for e in result.closed if (e.cleared_at or 0) >= events_from]
    return replayed


def monitor_revising(
    learned: LearnedModel,
    readings: Readings,
    *,
    learned_from: int,
) -> tuple[list[AlarmEvent], list[tuple[int, MonitorConfig]]]:
    """One stream's readings from its first through its learned model as the service runs
    them, its thresholds revised at each revision point (on the readings before it that no
    alarm covered) and applied from there: the events (closed, then still open) and the
    revisions. A revision waits while an alarm is open (thresholds are fitted again in
    normal operation, never in the middle of a fault: raised there, they could close its
    alarm while it lasts). Pure; the service adopts a revision from whichever reading its
    background job reaches, this from the revision point itself."""
    total = int(readings.counts[0])
    period = learned.sample_period_s
    revisions: list[tuple[int, MonitorConfig]] = []
    current = learned.recurrence()
    state = current.new_state()
    closed: list[AlarmEvent] = []

    def run(stop: int) -> None:
        start = state.samples
        replayed = replay(
            current,
            state,
            readings.part(start, stop),
            period,
            quiet_until=learned_from,
            events_from=learned_from,
        )
        closed.extend(replayed.closed)

    while True:
        point = next_revision(learned, revisions[-1][0] if revisions else learned_from)
        run(min(total, point))
        while state.samples < total and current.monitor.open_events(state.monitor):
            run(state.samples + 1)
        if state.samples >= total:
            return closed + current.monitor.open_events(state.monitor), revisions
        stop = state.samples
        covered = [(start, end) for _, start, end in alarm_spans(closed)]
        config = revised_monitor(learned, readings.part(0, stop), covered=covered)
        revisions.append((stop, config))
        current = Recurrence(learned.forecaster, config)


def revised_monitor(
    learned: LearnedModel,
    readings: Readings,
    *,
    covered: Sequence[tuple[int, int | None]],
) -> MonitorConfig:
    """The learned monitor with its thresholds fitted again (`app.learning.adapt.revise`) on
    one stream's readings from its first: their residuals under the learned model, those that
    no alarm (`covered` spans, as the alarm rows hold them) covered."""
    values = readings.values
    result = learned.forecast(readings)
    normal = result.monitored.copy()
    for start, stop in covered:  # never evidence of normal
        normal[start : normal.shape[0] if stop is None else stop] = False
    return revise(
        learned,
        result.residuals,
        values,
        normal=normal,
        missing=np.isnan(values).any(axis=1).astype(np.float64),
        reference_gaps=None if readings.references is None else result.reference_gap,
    )
