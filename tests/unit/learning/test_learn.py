"""What a stream learns: its period, its seasons, each channel's model, and a model that
forecasts the same however its readings are grouped."""

from __future__ import annotations

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.lagged import fit_channel
from app.learning import thresholds
from app.learning.learn import LearnedModel, learn, sample_period, seasonal_periods
from app.learning.thresholds import RMS_LONG_WINDOW, RMS_WINDOW
from app.monitoring.config import MonitorConfig, RollingRMSConfig
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising


def micros(seconds: np.ndarray) -> np.ndarray:
    return np.round((1.7e9 + seconds) * 1e6).astype(np.int64)


def test_the_period_is_the_median_step_and_seasons_come_from_the_data() -> None:
    steps = np.array([0, 1, 2, 4, 5, 6, 7], dtype=float)  # one longer gap
    assert sample_period(micros(steps)) == 1.0
    t = np.arange(600)
    wave = np.sin(2 * np.pi * t / 40) + np.random.default_rng(0).normal(0, 0.1, 600)
    assert 40 in seasonal_periods(wave, 1.0)
    walk = np.cumsum(np.random.default_rng(1).normal(0, 1, 600))
    assert seasonal_periods(walk, 1.0) == []


def test_each_channel_gets_the_model_its_readings_call_for() -> None:
    rng = np.random.default_rng(2)
    level = 5 + rng.normal(0, 1, 800)
    walk = np.cumsum(rng.normal(0, 1, 800))
    assert fit_channel(level, [])[0].kind == "level"
    assert fit_channel(walk, [])[0].kind in {"naive", "ar-differenced"}


def test_a_learned_model_forecasts_alike_in_any_grouping_and_round_trips() -> None:
    rng = np.random.default_rng(3)
    values = np.column_stack([5 + rng.normal(0, 1, 1500), np.cumsum(rng.normal(0, 1, 1500))])
    times = micros(np.arange(1500.0))
    learned = learn(times[:1000], values[:1000])
    again = LearnedModel.from_json(learned.to_json())
    assert again.to_json() == learned.to_json()
    whole, parts = learned.recurrence(), again.recurrence()
    one, other = whole.new_state(), parts.new_state()
    all_at_once = whole.advance([one], Readings.of_one(times, values), [1.0]).stream(0)
    pieces = [
        parts.advance([other], Readings.of_one(times[a:b], values[a:b]), [1.0]).stream(0)
        for a, b in [(0, 7), (7, 400), (400, 1500)]
    ]
    assert np.array_equal(
        np.concatenate([p.forecasts for p in pieces]), all_at_once.forecasts, equal_nan=True
    )


def test_too_little_to_learn_from_is_refused() -> None:
    with pytest.raises(DataError, match="at least 100"):
        learn(micros(np.arange(50.0)), np.zeros(50))
    values = np.column_stack([np.arange(200.0), np.full(200, np.nan)])
    with pytest.raises(DataError, match="channel 1 has no number"):
        learn(micros(np.arange(200.0)), values)


def test_a_learned_rolling_rms_rests_where_the_noise_puts_it_and_closes_after_a_burst() -> None:
    """Its resting level is measured while learning, below its threshold, so that an alarm
    whose energy hovers about the threshold stays one; and a burst of energy still closes
    once it has passed."""
    rng = np.random.default_rng(4)
    values = 5 + rng.standard_t(5, size=6000)
    values[3000:3300] = 5 + 3 * rng.standard_normal(300)  # a machine running rough
    times = micros(np.arange(6000.0))
    learned = learn(times[:2000], values[:2000])
    (rms,) = [d for d in learned.monitor.detectors if d.kind == "rolling_rms"]
    assert rms.resting is not None and 0.3 < rms.resting < 1.0
    events, _ = monitor_revising(learned, Readings.of_one(times, values), learned_from=2000)
    bursts = [e for e in events if e.detector == "rolling_rms"]
    assert len(bursts) == 1 and 3000 <= bursts[0].start < 3050
    assert bursts[0].cleared_at is not None and bursts[0].cleared_at < 3300 + 100


def test_a_long_learning_watches_the_residual_energy_over_a_longer_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the learning holds 10,000 readings the rolling RMS averages 200, not 50. Here
    the normal noise comes in bursts (40 readings in 100 rough): a machine that runs rough
    throughout (600 readings, its RMS a third above normal) is within what 50 readings swing
    through, and stands out over 200. With fewer learning readings it stays 50: they cannot
    characterise a longer one. A revision keeps the window (its state carries over)."""
    rng = np.random.default_rng(0)
    count = 30_000
    noise = np.where(np.arange(count) % 100 < 40, 1.8, 0.8)
    values = 5 + noise * rng.standard_normal(count)
    values[20_000:20_600] = 5 + 1.7 * rng.standard_normal(600)
    times, readings = (
        micros(np.arange(float(count))),
        Readings.of_one(micros(np.arange(float(count))), values),
    )

    def alarms(learned: LearnedModel, learned_from: int = 10_000) -> list[tuple[str, int]]:
        events, revisions = monitor_revising(learned, readings, learned_from=learned_from)
        assert revisions and all(
            rolling_rms_window(monitor) == rolling_rms_window(learned.monitor)
            for _, monitor in revisions
        )
        return [(e.detector, e.start) for e in events]

    learned = learn(times[:10_000], values[:10_000])
    assert rolling_rms_window(learned.monitor) == RMS_LONG_WINDOW
    found = alarms(learned)
    assert [detector for detector, _ in found] == ["rolling_rms"], found
    assert 20_000 <= found[0][1] < 20_600
    # Learned from 2,000 readings: 50, kept by its revisions on 4,000 to 16,000 readings.
    short = learn(times[:2000], values[:2000])
    assert rolling_rms_window(short.monitor) == RMS_WINDOW
    alarms(short, learned_from=2000)
    # The readings that teach count, not those under alarms.
    normal = np.arange(12_000) >= 4000
    kept = learn(times[:12_000], values[:12_000], normal=normal)
    assert rolling_rms_window(kept.monitor) == RMS_WINDOW
    monkeypatch.setattr(thresholds, "RMS_LONG_WINDOW", RMS_WINDOW)  # as it would be with 50
    assert alarms(learn(times[:10_000], values[:10_000])) == []


def rolling_rms_window(monitor: MonitorConfig) -> int:
    return next(d.window for d in monitor.detectors if isinstance(d, RollingRMSConfig))
