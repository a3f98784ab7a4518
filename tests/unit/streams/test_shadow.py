from __future__ import annotations

import numpy as np

from app.forecasting.baselines import Naive
from app.monitoring.config import MonitorConfig, PointConfig
from app.streams.blocks import Readings
from app.streams.recurrence import Recurrence
from app.streams.shadow import run


def swinging(count: int, swing_from: int) -> Readings:
    values = np.zeros((count, 1))
    values[swing_from::2, 0] = 5.0
    times = ((1.7e9 + 0.1 * np.arange(count)) * 1e6).astype(np.int64)
    return Readings.of_one(times, values, None)


def test_the_warm_up_raises_nothing_and_the_rest_is_scored() -> None:
    recurrence = Recurrence(Naive(window=4), MonitorConfig(detectors=[PointConfig(threshold=1.0)]))
    readings = swinging(200, swing_from=51)  # swings in the warm-up's last readings too
    scored = run(recurrence, readings, 0.1, start=1000, skip=60)
    assert scored.monitored == 140
    assert scored.residual_rmse == 5.0
    assert scored.events and all(event.start >= 1060 for event in scored.events)
    quiet = run(recurrence, swinging(200, swing_from=400), 0.1, start=0, skip=60)
    assert quiet.events == [] and quiet.residual_rmse == 0.0
