"""A stream's forecasts depend on its own readings only: not on which streams share a call, nor
on how its readings are cut into blocks. The stream recurrence's replay after a crash relies on
it (`app.forecasting.base`), so equality here is bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig

CHANNELS = 2
STREAMS = 600
READINGS = 40


def records(streams: int, readings: int, seed: int = 0) -> np.ndarray:
    """(streams, readings, C) float64: waves on random walks, a different level per stream."""
    rng = np.random.default_rng(seed)
    t = np.arange(readings)
    wave = np.sin(2 * np.pi * t / 11)[None, :, None]
    walk = np.cumsum(0.1 * rng.normal(size=(streams, readings, CHANNELS)), axis=1)
    return wave + walk + rng.uniform(-50, 50, size=(streams, 1, CHANNELS))


@pytest.fixture(scope="module", params=["lstm", "lstm-stateful", "linear-ar", "naive", "seasonal"])
def forecaster(request: pytest.FixtureRequest) -> Forecaster:
    training = records(1, 1500, seed=1)[0]
    fast = TrainingConfig(epochs=1, batch_size=64, validation=100)
    made: Forecaster = {
        "lstm": lambda: LSTMForecaster(window=16, hidden=8, n_channels=CHANNELS, training=fast),
        "lstm-stateful": lambda: StatefulLSTMForecaster(
            window=16,
            hidden=8,
            n_channels=CHANNELS,
            sequence=16,
            training=TrainingConfig(epochs=1, batch_size=4, validation=100),
        ),
        "linear-ar": lambda: LinearAR(window=16, horizon=2, n_channels=CHANNELS),
        "naive": lambda: Naive(window=16, n_channels=CHANNELS),
        "seasonal": lambda: SeasonalNaive(period=11, window=16, n_channels=CHANNELS),
    }[request.param]()
    return made.fit(training, train_end=1400)


def fresh(forecaster: Forecaster, streams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The forecasts after each reading of streams that start afresh, and their carry."""
    count = streams.shape[0]
    history = np.full((count, forecaster.context, CHANNELS), np.nan)
    return forecaster.advance(history, streams, forecaster.initial_carry(count))


def test_a_streams_forecasts_do_not_depend_on_the_streams_beside_it(
    forecaster: Forecaster,
) -> None:
    streams = records(STREAMS, READINGS)
    together, carry = fresh(forecaster, streams)
    some = np.random.default_rng(2).permutation(STREAMS)[:64]
    shuffled, shuffled_carry = fresh(forecaster, streams[some])
    np.testing.assert_array_equal(shuffled, together[some])
    np.testing.assert_array_equal(shuffled_carry, carry[some])
    for row in (0, 317, STREAMS - 1):
        alone, alone_carry = fresh(forecaster, streams[row : row + 1])
        np.testing.assert_array_equal(alone[0], together[row])
        np.testing.assert_array_equal(alone_carry[0], carry[row])


@pytest.mark.parametrize("cuts", [(1, 2, 3, 20), (17,), tuple(range(1, READINGS))])
def test_cutting_the_readings_into_blocks_changes_nothing(
    forecaster: Forecaster, cuts: tuple[int, ...]
) -> None:
    streams = records(5, READINGS, seed=3)
    whole, whole_carry = fresh(forecaster, streams)
    history = np.full((5, forecaster.context, CHANNELS), np.nan)
    carry = forecaster.initial_carry(5)
    parts = []
    for block in np.split(streams, cuts, axis=1):
        made, carry = forecaster.advance(history, block, carry)
        parts.append(made)
        history = np.concatenate((history, block), axis=1)[:, -forecaster.context :]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)
    np.testing.assert_array_equal(carry, whole_carry)


def test_predict_is_exact_whatever_the_batch(forecaster: Forecaster) -> None:
    windows = records(1000, forecaster.window, seed=4)
    every = forecaster.predict(windows)
    for row in (0, 9, 999):
        np.testing.assert_array_equal(forecaster.predict(windows[row : row + 1])[0], every[row])
    np.testing.assert_array_equal(forecaster.predict(windows[::-1]), every[::-1])
