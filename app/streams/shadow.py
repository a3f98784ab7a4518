"""A candidate model beside the one a stream runs: both over the same stored readings, what
each forecasts and would alarm on. Pure: `GET /v1/streams/{id}/shadow` reads the readings and
runs both through `run`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.monitoring.alarms import AlarmEvent
from app.streams.blocks import Readings
from app.streams.recurrence import Recurrence


@dataclass(frozen=True)
class Run:
    """One model over the readings: its residuals' RMS where the detectors saw them, how many
    they saw, and the alarms it raised or would raise (still open ones last)."""

    residual_rmse: float | None
    monitored: int
    events: list[AlarmEvent]


def run(
    recurrence: Recurrence, readings: Readings, sample_period_s: float, *, start: int, skip: int
) -> Run:
    """One stream's readings from sample `start` through a fresh state of `recurrence`: the
    first `skip` warm it up silently (as a switch warms a new model), the rest are scored."""
    state = recurrence.quietly(_part(readings, 0, skip), sample_period_s, start=start)
    total = int(readings.counts[0])
    result = recurrence.advance([state], _part(readings, skip, total), [sample_period_s]).stream(0)
    seen = result.residual[result.monitored]
    rmse = math.sqrt(float(np.mean(seen**2))) if seen.size else None
    events = result.closed + recurrence.monitor.open_events(state.monitor)
    return Run(rmse, int(seen.size), events)


def _part(readings: Readings, start: int, stop: int) -> Readings:
    return Readings(
        np.array([stop - start]),
        readings.times[start:stop],
        readings.values[start:stop],
        None if readings.references is None else readings.references[start:stop],
    )
