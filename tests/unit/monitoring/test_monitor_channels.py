"""A monitor of several forecast channels: each residual detector runs on every channel, its
statistic scaled by the channel's gain, and an alarm says which channels made its peak."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from app.monitoring.alarms import AlarmPolicy
from app.monitoring.config import (
    MahalanobisConfig,
    MissingConfig,
    MonitorConfig,
    PointConfig,
    ShiftConfig,
    VarianceFloorConfig,
)
from app.monitoring.monitor import Monitor


def monitor(*detectors: object, channels: int = 3) -> Monitor:
    return Monitor(
        MonitorConfig.model_validate(
            {
                "channels": channels,
                "alarm": AlarmPolicy(k=1, n=1, m=5).model_dump(),
                "detectors": [d.model_dump() for d in detectors],  # type: ignore[attr-defined]
            }
        )
    )


def test_each_channel_is_watched_with_its_gain_and_the_alarm_names_the_channel() -> None:
    watched = monitor(PointConfig(threshold=4.0, gains=[1.0, 0.5, 0.0]))
    residuals = np.zeros((1, 30, 3))
    residuals[0, 5, 1] = 6.0  # x 0.5 = 3: inside
    residuals[0, 10, 1] = 10.0  # x 0.5 = 5: an alarm, made by channel 1
    residuals[0, 15, 2] = 100.0  # channel 2 is not watched by the point detector
    state = watched.new_state()
    block = watched.advance([state], residuals, first_samples=[0])
    assert block.statistics["point"][0, 10] == 5.0
    assert block.statistics["point"][0, 15] == 0.0
    (event,) = block.opened[0]
    assert (event.start, event.peak, event.detail) == (10, 5.0, (0.0, 5.0, 0.0))
    (closed,) = block.closed[0]
    assert closed.detail == (0.0, 5.0, 0.0)


def test_a_below_detector_alarms_on_the_lowest_channel() -> None:
    watched = monitor(VarianceFloorConfig(threshold=0.1, window=4), channels=2)
    rng = np.random.default_rng(0)
    residuals = rng.standard_normal((1, 40, 2))
    residuals[0, 20:30, 1] = 0.5  # channel 1 frozen
    block = watched.advance([watched.new_state()], residuals, first_samples=[0])
    (event,) = block.opened[0]
    assert event.start == 23  # the fourth frozen reading fills the window
    assert event.detail is not None and event.detail[1] == 0.0


def test_per_channel_state_gives_the_same_result_in_any_grouping() -> None:
    watched = monitor(
        ShiftConfig(threshold=1.0, window=6, gains=[1.0, 2.0, 0.5]),
        MahalanobisConfig(threshold=20.0, covariance=np.eye(3).tolist()),
    )
    rng = np.random.default_rng(1)
    residuals = rng.standard_normal((1, 500, 3))
    residuals[0, 200:260, 2] += 3.0
    residuals[0, rng.random(500) < 0.05] = np.nan
    whole_state, split_state = watched.new_state(), watched.new_state()
    whole = watched.advance([whole_state], residuals, first_samples=[0])
    opened = []
    for start in range(0, 500, 37):
        part = watched.advance(
            [split_state], residuals[:, start : start + 37], first_samples=[start]
        )
        opened += part.opened.get(0, [])
    assert opened == whole.opened[0]
    assert np.array_equal(whole_state.values, split_state.values, equal_nan=True)
    saved = watched.state_to_json(split_state)
    restored = watched.state_from_json(saved)
    assert np.array_equal(restored.values, split_state.values, equal_nan=True)


def test_mahalanobis_detail_is_each_channels_term() -> None:
    watched = monitor(
        MahalanobisConfig(threshold=9.0, covariance=[[1.0, 0.8], [0.8, 1.0]]), channels=2
    )
    residuals = np.zeros((1, 3, 2))
    residuals[0, 1] = [3.0, -3.0]  # against the correlation
    block = watched.advance([watched.new_state()], residuals, first_samples=[0])
    (event,) = block.opened[0]
    assert event.detail is not None
    assert sum(event.detail) == pytest.approx(event.peak)
    assert event.detail[0] == pytest.approx(event.detail[1])


def test_missing_readings_alarm_k_of_n() -> None:
    watched = monitor(MissingConfig(alarm=AlarmPolicy(k=3, n=5, m=4)), PointConfig(threshold=9.0))
    missing = np.zeros((1, 30))
    missing[0, [3, 9, 12]] = 1.0  # never 3 within 5
    missing[0, [20, 21, 23]] = 1.0  # 3 within 5: an alarm at the third
    block = watched.advance(
        [watched.new_state()], np.zeros((1, 30, 3)), first_samples=[0], missing=missing
    )
    (event,) = block.opened[0]
    assert (event.detector, event.start) == ("missing", 23)


def test_gains_are_checked() -> None:
    with pytest.raises(ValidationError, match="2 gains for 3 channels"):
        monitor(PointConfig(threshold=1.0, gains=[1.0, 1.0]))
    with pytest.raises(ValidationError, match="every gain is 0"):
        monitor(PointConfig(threshold=1.0, gains=[0.0, 0.0, 0.0]))
    with pytest.raises(ValidationError, match="takes no gains"):
        monitor(MissingConfig(gains=[1.0, 1.0, 1.0]))
