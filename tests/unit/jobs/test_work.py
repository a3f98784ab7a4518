"""What a job computes, without a service: thresholds for a false-alarm budget from a stream's
readings, and a forecaster trained again of the same configuration."""

from __future__ import annotations

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.baselines import Naive
from app.forecasting.linear_ar import LinearAR
from app.jobs.work import MIN_HOLDOUT, holdout_thresholds, retrained
from app.streams.blocks import Readings

PERIOD = 0.1


def noisy(count: int, seed: int = 0) -> Readings:
    rng = np.random.default_rng(seed)
    times = (1.7e9 + PERIOD * np.arange(count)) * 1e6
    values = np.sin(np.arange(count) / 20)[:, None] + rng.normal(0, 0.05, (count, 1))
    return Readings.of_one(times.astype(np.int64), values, None)


def test_a_smaller_budget_gives_higher_thresholds_above_what_normal_reaches() -> None:
    readings = noisy(20_000)
    loose, _ = holdout_thresholds(
        Naive(window=8), readings, PERIOD, hold_from=2000, false_alarms_per_day=1000
    )
    tight, how = holdout_thresholds(
        Naive(window=8), readings, PERIOD, hold_from=2000, false_alarms_per_day=10
    )
    loose_by, tight_by = (
        {d.kind: d.threshold for d in config.detectors} for config in (loose, tight)
    )
    assert tight_by["point"] > loose_by["point"] > 0
    residuals = np.abs(np.diff(readings.values[2000:, 0]))
    assert tight_by["point"] > np.percentile(residuals, 99)
    assert how["false_alarms_per_day"] == 10 and how["method"] == "false-alarm-rate"


def test_too_few_readings_give_no_thresholds() -> None:
    with pytest.raises(DataError, match=f"thresholds need at least {MIN_HOLDOUT}"):
        holdout_thresholds(
            Naive(window=8), noisy(600), PERIOD, hold_from=200, false_alarms_per_day=1
        )


def test_a_retrain_fits_the_same_configuration_on_the_readings_given() -> None:
    values = noisy(3000).values
    old = LinearAR(window=16).fit(values[:1000], train_end=1000)
    new = retrained(old.config(), values, train_end=2500)
    assert new.config() == old.config() and new.kind == "linear-ar"
    again = LinearAR(window=16).fit(values, train_end=2500)
    windows = np.stack([values[i - 16 : i] for i in range(2600, 2700)])
    np.testing.assert_array_equal(new.predict(windows), again.predict(windows))
