"""What a job computes from one stream's readings: thresholds for a false-alarm budget on a
stretch of normal operation (recalibrate), or a forecaster trained again on it (retrain); for a
stream that learns its own model, the same done to its learned model. Pure: arrays in, a model
out; `app/jobs/process.py` reads the readings and stores the result."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from app.errors import DataError
from app.forecasting.artifacts import build_forecaster
from app.forecasting.base import Forecaster
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.learning.adapt import refit
from app.learning.learn import LearnedModel, learn
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.calibration import DetectorSettings, HoldOut, calibrate_rate
from app.monitoring.config import MonitorConfig
from app.monitoring.workflow import WATCH_ONLY
from app.streams.blocks import Readings
from app.streams.recurrence import Recurrence

MIN_HOLDOUT = 500
"""Fewest monitored readings thresholds are calibrated on: fewer say little about a tail."""

HOLDOUT_SHARE = 0.2
"""A retrain's last fifth of the period is kept out of its training: its thresholds come
from readings the new model never saw."""


def holdout_thresholds(
    forecaster: Forecaster,
    readings: Readings,
    sample_period_s: float,
    *,
    hold_from: int,
    false_alarms_per_day: float,
    alarm: AlarmPolicy | None = None,
) -> tuple[MonitorConfig, dict[str, Any]]:
    """Thresholds for `false_alarms_per_day` from the detectors' statistics over one stream's
    readings from `hold_from` on (those before warm the stream up, as a live stream is warm),
    and how they were set (`app/monitoring/calibration.py`: the calibration report)."""
    recurrence = Recurrence(forecaster, WATCH_ONLY)
    result = recurrence.advance([recurrence.new_state()], readings, [sample_period_s]).stream(0)
    held = HoldOut(
        np.where(result.monitored, result.residual, np.nan),  # what the detectors see
        result.reference_gap if readings.references is not None else None,
        start=hold_from,
    )
    if held.valid_samples < MIN_HOLDOUT:
        raise DataError(
            f"the period holds {held.valid_samples} monitored readings after the warm-up; "
            f"thresholds need at least {MIN_HOLDOUT}"
        )
    config = calibrate_rate(
        held,
        false_alarms_per_day,
        sample_period_s=sample_period_s,
        settings=DetectorSettings(alarm=alarm or AlarmPolicy()),
    )
    return config, dict(config.calibration or {})


def retrained(
    config: dict[str, Any],
    values: np.ndarray,
    *,
    train_end: int,
    epochs: int | None = None,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> Forecaster:
    """A forecaster of the same configuration as `config` (a model's `config()`), fitted on
    `values[:train_end]` ((T, C): one stream's readings)."""
    config = copy.deepcopy(config)
    if epochs is not None and "training" in config:
        config["training"]["epochs"] = epochs
    forecaster = build_forecaster(config)
    if isinstance(forecaster, LSTMForecaster | StatefulLSTMForecaster):
        forecaster.fit(values, train_end=train_end, on_epoch=on_epoch)
    else:
        forecaster.fit(values, train_end=train_end)
    return forecaster


def recalibrated_learned(
    learned: LearnedModel,
    readings: Readings,
    *,
    hold_from: int,
    false_alarms_per_day: float,
) -> LearnedModel:
    """The learned model with its detectors fitted afresh for `false_alarms_per_day` on one
    stream's readings from `hold_from` on (normal operation, by the operator's word: unlike a
    periodic revision, not bounded by the thresholds it had); those before warm it up."""
    values = readings.values
    result = learned.forecast(readings)
    held = result.monitored.copy()
    held[:hold_from] = False
    if int(held.sum()) < MIN_HOLDOUT:
        raise DataError(
            f"the period holds {int(held.sum())} monitored readings after the warm-up; "
            f"thresholds need at least {MIN_HOLDOUT}"
        )
    monitor, scales = refit(
        learned,
        result.residuals,
        values,
        normal=held,
        missing=np.isnan(values).any(axis=1).astype(np.float64),
        reference_gaps=None if readings.references is None else result.reference_gap,
        false_alarms_per_day=false_alarms_per_day,
    )
    return replace(
        learned, monitor=monitor, scales=scales, false_alarms_per_day=false_alarms_per_day
    )


def relearned(
    learned: LearnedModel, readings: Readings, *, false_alarms_per_day: float
) -> LearnedModel:
    """The stream learned afresh from one stream's readings, as its first fit learned it."""
    return learn(
        readings.times,
        readings.values,
        sample_period_s=learned.sample_period_s,
        false_alarms_per_day=false_alarms_per_day,
        references=readings.references,
        lstm=learned.network is not None,
    )
