"""The stateful LSTM candidate of a learning stream: tried only where it may help, chosen only
when it forecasts clearly better, and kept in the database as exactly what was trained."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.errors import ArtifactError
from app.forecasting.artifacts import load_model, pack_forecaster, unpack_forecaster
from app.learning import network
from app.learning.learn import LearnedModel, learn
from app.learning.network import LSTM_MIN_READINGS, not_tried
from app.registry import SHIPPED_MODELS_DIR
from app.simulation.twin import simulate
from app.streams.blocks import Readings

READINGS = LSTM_MIN_READINGS + 2000


def micros(count: int) -> np.ndarray:
    return (np.arange(count) * 100_000 + 1_700_000_000_000_000).astype(np.int64)


def residuals(learned: LearnedModel, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    recurrence = learned.recurrence()
    result = recurrence.advance(
        [recurrence.new_state()], Readings.of_one(times, values), [learned.sample_period_s]
    )
    return result.stream(0).residuals


def test_a_packed_network_forecasts_exactly_as_the_one_packed() -> None:
    shipped = load_model(SHIPPED_MODELS_DIR / "lstm-stateful-day-seed3").forecaster
    packed = json.loads(json.dumps(pack_forecaster(shipped)))
    restored = unpack_forecaster(packed)
    windows = simulate(0, 512).value.reshape(2, 256, 1)
    np.testing.assert_array_equal(restored.predict(windows), shipped.predict(windows))

    broken = dict(packed, graph=packed["graph"][:100])
    with pytest.raises(ArtifactError):
        unpack_forecaster(broken)
    with pytest.raises(ArtifactError, match="unreadable"):
        unpack_forecaster(dict(packed, arrays="not base64!"))


def test_the_candidate_says_why_it_was_not_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not_tried(READINGS, 1, wanted=True) is None
    assert "one channel" in str(not_tried(READINGS, 2, wanted=True))
    assert "10,000" in str(not_tried(LSTM_MIN_READINGS - 1, 1, wanted=True))
    assert "switched off" in str(not_tried(READINGS, 1, wanted=False))
    monkeypatch.setattr(network, "torch_available", lambda: False)
    assert "torch is not installed" in str(not_tried(READINGS, 1, wanted=True))

    values = np.random.default_rng(0).normal(0, 1, (1000, 1))
    learned = learn(micros(1000), values, lstm=True)
    assert learned.network is None and "10,000" in learned.network_note


def test_nulls_are_carried_forward_for_training() -> None:
    values = np.array([[np.nan], [1.0], [np.nan], [np.nan], [4.0]])
    np.testing.assert_array_equal(network._carried_forward(values)[:, 0], [1.0, 1.0, 1.0, 1.0, 4.0])


def test_the_twin_earns_its_network_and_keeps_it_through_the_database() -> None:
    """The twin's stiffening mount is non-linear: the network forecasts clearly better than
    any linear model, and the stored model forecasts exactly as the trained one."""
    values = simulate(3, READINGS).value[:, None]
    values[500:510] = np.nan  # a few nulls: carried forward for training, skipped in serving
    times = micros(READINGS)
    learned = learn(times, values, lstm=True)
    assert learned.network is not None, learned.network_note
    assert learned.network_note.startswith("chosen")
    assert learned.kinds == ["lstm-stateful"]
    summary = learned.summary(["value"])["value"]
    assert summary["validation_rmse"] < 0.9 * summary["linear_rmse"]

    stored = LearnedModel.from_json(json.loads(json.dumps(learned.to_json())))
    assert stored.kinds == ["lstm-stateful"] and stored.network_note == learned.network_note
    np.testing.assert_array_equal(
        residuals(stored, times, values), residuals(learned, times, values)
    )
    without = learn(times, values)
    assert without.network is None and "switched off" in without.network_note


def test_a_linear_series_keeps_its_linear_model() -> None:
    """On an autoregression the linear model is optimal: the network is not clearly better."""
    rng = np.random.default_rng(4)
    noise = rng.normal(0, 1, READINGS)
    series = np.empty(READINGS)
    series[0] = 0.0
    for t in range(1, READINGS):
        series[t] = 0.7 * series[t - 1] + noise[t]
    learned = learn(micros(READINGS), series[:, None], lstm=True)
    assert learned.network is None
    assert learned.network_note.startswith("not chosen"), learned.network_note
    assert learned.kinds == ["ar"]
