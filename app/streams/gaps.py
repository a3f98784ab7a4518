"""The bookkeeping of a block of readings (the missing-readings rule of
app/streams/recurrence.py): which readings are forecast, imputed, dropped or start a run. It
depends only on which readings are null and when they came, never on a forecast, so it is
settled before any forecasting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.streams.blocks import StreamState

# What happens to a reading.
NONE, REAL, IMPUTED, DROPPED = 0, 1, 2, 3


@dataclass
class Plan:
    """The bookkeeping of a block, (N, T) each: it depends on which readings are null and when
    they came, never on a forecast, so it is settled before any forecasting."""

    action: np.ndarray  # int8: NONE (no reading), REAL, IMPUTED or DROPPED
    warm: np.ndarray  # bool: the reading has a forecast
    fresh: np.ndarray  # bool: the reading starts a run (history and carry start afresh)
    clean: np.ndarray  # bool: no imputed reading in its window


def restarts(
    states: Sequence[StreamState],
    times: np.ndarray,
    offsets: np.ndarray,
    counts: np.ndarray,
    periods: Sequence[float],
    max_gap: int,
) -> np.ndarray:
    """True where a reading follows the stream's previous one by more than `max_gap`
    sample periods."""
    previous = np.empty(len(times), dtype=np.int64)
    previous[1:] = times[:-1]
    firsts = offsets[:-1][counts > 0]
    last = [state.last_time for state, count in zip(states, counts.tolist(), strict=True) if count]
    previous[firsts] = [
        times[first] if t is None else t for t, first in zip(last, firsts, strict=True)
    ]
    limits = np.repeat(np.asarray(periods, dtype=np.float64) * max_gap, counts)
    return np.asarray((times - previous) / 1e6 > limits)


def plan_block(
    states: Sequence[StreamState],
    present: np.ndarray,
    null: np.ndarray,
    restart: np.ndarray,
    counts: np.ndarray,
    *,
    window: int,
    max_gap: int,
) -> Plan:
    """Which readings are forecast, imputed, dropped or start a run (the module's rule).
    A stream without nulls or gaps in the block moves on in closed form; the others step
    from event to event."""
    steps = present.shape[1]
    run = np.array([state.run for state in states], dtype=np.int64)
    since = np.array([state.since_imputed for state in states], dtype=np.int64)
    ages = np.arange(steps)
    before = run[:, None] + ages  # readings in the run before each reading, no events
    planned = Plan(
        action=np.where(present, REAL, NONE).astype(np.int8),
        warm=before >= window,
        fresh=before == 0,
        clean=since[:, None] + ages >= window,
    )
    events = null | restart
    eventful = set(np.flatnonzero(events.any(axis=1)).tolist()) if events.any() else set()
    for row, state in enumerate(states):
        if row in eventful:
            _plan_row(
                state, row, planned, null[row], restart[row], int(counts[row]), window, max_gap
            )
        elif counts[row]:
            state.run = min(window, state.run + int(counts[row]))
            state.since_imputed = min(window, state.since_imputed + int(counts[row]))
            state.missing_run = 0
    planned.warm &= present
    planned.fresh &= present
    return planned


def _plan_row(
    state: StreamState,
    row: int,
    plan: Plan,
    null: np.ndarray,
    restart: np.ndarray,
    count: int,
    window: int,
    max_gap: int,
) -> None:
    run, since, missing = state.run, state.since_imputed, state.missing_run

    def real(start: int, stop: int) -> None:
        nonlocal run, since, missing
        if stop > start:
            ages = np.arange(stop - start)
            plan.warm[row, start:stop] = run + ages >= window
            plan.fresh[row, start:stop] = run + ages == 0
            plan.clean[row, start:stop] = since + ages >= window
            run, since = min(window, run + stop - start), min(window, since + stop - start)
            missing = 0

    start = 0  # the first reading not planned yet
    for event in np.flatnonzero((null | restart)[:count]).tolist():
        real(start, event)
        if restart[event]:
            run, since = 0, window
        if not null[event]:
            start = event  # a real reading after a gap: it starts the next stretch
            continue
        missing += 1
        plan.fresh[row, event] = False
        if missing > max_gap or run < window:
            plan.action[row, event] = DROPPED
            plan.warm[row, event] = False
            run, since = 0, window
        else:
            plan.action[row, event] = IMPUTED
            plan.warm[row, event], plan.clean[row, event] = True, False
            run, since = min(window, run + 1), 0
        start = event + 1
    real(start, count)
    state.run, state.since_imputed, state.missing_run = run, since, missing
