"""A learned stream holds the readings of an open alarm out of its model's history: a sustained
fault stays alarmed for as long as it lasts and closes when the readings are back, a seasonal
model does not echo a fault one season later, a wandering sensor is never held, and all of it
gives the same bits however the readings are grouped into blocks (and across a checkpoint)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.forecasting.lagged import ChannelFit, LaggedLinear
from app.learning.learn import LearnedModel, learn
from app.learning.thresholds import RMS_WINDOW
from app.monitoring.alarms import AlarmEvent
from app.monitoring.incidents import incident_spans
from app.streams.blocks import Readings, StreamState
from app.streams.recurrence import Recurrence

T0 = 1_700_000_000_000_000


def micros(count: int, period_s: float = 1.0) -> np.ndarray:
    return (T0 + np.arange(count) * round(period_s * 1e6)).astype(np.int64)


def ar1(rng: np.random.Generator, count: int, phi: float) -> np.ndarray:
    noise = rng.normal(0, 1, count)
    out = np.empty(count)
    out[0] = noise[0]
    for i in range(1, count):
        out[i] = phi * out[i - 1] + noise[i]
    return out


def events_of(
    recurrence: Recurrence, state: StreamState, values: np.ndarray, first: int
) -> list[AlarmEvent]:
    """Every event of readings `first:` (the readings before it run silently)."""
    times = micros(values.shape[0])
    quiet = Readings.of_one(times[:first], values[:first])
    recurrence.advance([state], quiet, [1.0])
    recurrence.monitor.quiet(state.monitor)
    state.held = 0
    result = recurrence.advance([state], Readings.of_one(times[first:], values[first:]), [1.0])
    part = result.stream(0)
    return part.closed + recurrence.monitor.open_events(state.monitor)


@pytest.fixture(scope="module")
def stationary() -> tuple[LearnedModel, np.ndarray]:
    """An autoregression (0.6) learned from 1,000 readings, and 3,000 of its readings with a
    shift of 5 sigma over 1,500..1,800."""
    values = 50 + ar1(np.random.default_rng(1), 3000, 0.6)
    learned = learn(micros(1000), values[:1000])
    assert learned.kinds == ["ar"]
    faulty = values.copy()
    faulty[1500:1800] += 5 * np.std(values[:1000])
    return learned, faulty


def test_a_sustained_shift_stays_alarmed_while_it_lasts_and_closes_after(
    stationary: tuple[LearnedModel, np.ndarray],
) -> None:
    learned, faulty = stationary
    recurrence = learned.recurrence()
    events = events_of(recurrence, recurrence.new_state(), faulty, 1000)
    incidents = incident_spans(events)
    during = [(a, b) for a, b in incidents if a < 1800 and (b is None or b > 1500)]
    assert len(during) == 1, incidents
    start, stop = during[0]
    assert 1500 <= start <= 1510
    # Closed once the rolling RMS's window (50 readings) has left the shift behind.
    assert stop is not None and 1800 <= stop <= 1800 + RMS_WINDOW + 10, (start, stop)


def test_without_holding_the_forecast_would_absorb_the_shift(
    stationary: tuple[LearnedModel, np.ndarray],
) -> None:
    """What holding prevents: the same model fed its alarmed readings follows the new level
    (its residuals' mean shrinks to a fraction of the shift), so the shift detector sees
    only the shift's start; held, its residuals keep the whole shift."""
    learned, faulty = stationary
    held = learned.recurrence()
    state = held.new_state()
    times = micros(faulty.shape[0])
    part = held.advance([state], Readings.of_one(times, faulty), [1.0]).stream(0)
    plain = learned.forecast(Readings.of_one(times, faulty))
    shift = 5 * np.std(faulty[:1000])
    assert np.nanmean(part.residual[1600:1790]) > 0.8 * shift
    assert np.nanmean(plain.residual[1600:1790]) < 0.5 * shift


def test_a_seasonal_model_does_not_echo_a_fault_a_season_later() -> None:
    rng = np.random.default_rng(2)
    count, period = 4000, 50
    values = 10 + 3 * np.sin(2 * np.pi * np.arange(count) / period) + rng.normal(0, 0.1, count)
    learned = learn(micros(1000), values[:1000])
    assert learned.kinds == ["seasonal-naive"]
    faulty = values.copy()
    faulty[2000:2020] += 2.0
    recurrence = learned.recurrence()
    events = events_of(recurrence, recurrence.new_state(), faulty, 1000)
    incidents = incident_spans(events)
    assert len(incidents) == 1, incidents
    assert 2000 <= incidents[0][0] <= 2005
    assert not [e for e in events if 2000 + period - 10 <= e.start < 2000 + 2 * period], events


def test_a_wandering_sensor_is_never_held() -> None:
    """A random walk has no normal level to return to: its readings always enter the history,
    so after a step the forecast follows it and the alarm closes within a few readings."""
    values = 100 + np.cumsum(np.random.default_rng(3).normal(0, 1, 3000))
    learned = learn(micros(1000), values[:1000])
    assert learned.kinds[0] in ("naive", "ar-differenced")
    forecaster = learned.forecaster
    assert np.isnan(forecaster.spread_growth(1)).all()
    faulty = values.copy()
    faulty[2000:] += 10.0
    recurrence = learned.recurrence()
    state = recurrence.new_state()
    incidents = incident_spans(events_of(recurrence, state, faulty, 1000))
    assert any(a <= 2002 and b is not None and b <= 2000 + RMS_WINDOW + 10 for a, b in incidents), (
        incidents
    )
    assert state.held == 0


def test_spread_growth_of_each_model() -> None:
    fits = [
        ChannelFit("level", (), (), 5.0, 0.0, 0.0, 0.0),
        ChannelFit("naive", (1,), (1.0,), 0.0, 0.0, 0.0, 0.0),
        ChannelFit("ar", (1,), (0.6,), 0.0, 0.0, 0.0, 0.0),
        ChannelFit("seasonal-naive", (24,), (1.0,), 0.0, 0.0, 0.0, 0.0, period=24),
    ]
    forecaster = LaggedLinear(fits)
    for steps in (1, 2, 10, 5000):
        growth = forecaster.spread_growth(steps)
        assert growth[0] == 1.0 and np.isnan(growth[1]) and growth[3] == 1.0
        expected = np.sqrt((1 - 0.36**steps) / (1 - 0.36))
        assert growth[2] == pytest.approx(expected, rel=1e-9)


def blocks_of(count: int, how: str, rng: np.random.Generator) -> list[tuple[int, int]]:
    if how == "whole":
        return [(0, count)]
    if how == "one by one":
        return [(i, i + 1) for i in range(count)]
    cuts = sorted({0, 1700, count, *rng.integers(1, count, size=count // 40).tolist()})
    return list(itertools.pairwise(cuts))


def run_in_blocks(
    recurrence: Recurrence, values: np.ndarray, blocks: list[tuple[int, int]], restore_at: int
) -> tuple[dict[str, np.ndarray], list[AlarmEvent], bytes]:
    times = micros(values.shape[0])
    state = recurrence.new_state()
    columns: dict[str, list[np.ndarray]] = {}
    events: list[AlarmEvent] = []
    for start, stop in blocks:
        if start == restore_at:  # a restart: the checkpoint, then on
            state = recurrence.restore(state.to_bytes(recurrence.monitor), state.last_time)
        part = recurrence.advance(
            [state], Readings.of_one(times[start:stop], values[start:stop]), [1.0]
        ).stream(0)
        for name, column in [
            ("forecast", part.forecast),
            ("residual", part.residual),
            *part.statistics.items(),
        ]:
            columns.setdefault(name, []).append(column)
        events += part.opened + part.closed
    joined = {name: np.concatenate(parts) for name, parts in columns.items()}
    return joined, sorted(events, key=repr), state.to_bytes(recurrence.monitor)


def test_holding_gives_the_same_bits_however_the_readings_are_grouped(
    stationary: tuple[LearnedModel, np.ndarray],
) -> None:
    learned, faulty = stationary
    values = faulty.copy()
    values[1650:1653] = np.nan  # nulls while held
    values[2500] += 30  # a spike after the shift
    recurrence = learned.recurrence()
    rng = np.random.default_rng(4)
    outcomes = {
        how: run_in_blocks(
            recurrence, values, blocks_of(values.shape[0], how, rng), restore_at=1700
        )
        for how in ("whole", "one by one", "ragged")
    }
    reference = outcomes.pop("whole")
    assert reference[1], "the shift and the spike raise alarms"
    for how, (columns, events, state) in outcomes.items():
        for name, column in columns.items():
            assert np.array_equal(column, reference[0][name], equal_nan=True), (how, name)
        assert events == reference[1], how
        assert state == reference[2], how
