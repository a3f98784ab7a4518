from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.errors import ArtifactError
from app.forecasting.artifacts import build_forecaster, load_model, save_model
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig
from app.forecasting.windows import sliding_windows

TINY = TrainingConfig(epochs=4, batch_size=4, lr=1e-2, validation=100)


def noisy_wave(samples: int = 1200, seed: int = 0) -> np.ndarray:
    """A period-11 oscillation on a drifting level, like the twin but cheap."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples)
    return np.sin(2 * np.pi * t / 11) + 1e-3 * t + 0.05 * rng.normal(size=samples)


@pytest.fixture(scope="module")
def tiny() -> StatefulLSTMForecaster:
    model = StatefulLSTMForecaster(window=32, hidden=8, sequence=32, training=TINY)
    return model.fit(noisy_wave(), train_end=1000)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def stream(model: StatefulLSTMForecaster, series: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One fresh stream's forecasts after each reading of `series` ((T,) or (T, C)), and its
    carry after the last."""
    rows = series.reshape(1, series.shape[0], -1)
    fresh = np.full((1, 1, rows.shape[2]), np.nan)
    forecasts, carry = model.advance(fresh, rows, model.initial_carry(1))
    return forecasts[0], carry


def test_has_the_window_lstms_architecture() -> None:
    assert StatefulLSTMForecaster().n_parameters == LSTMForecaster().n_parameters == 12_961
    model = StatefulLSTMForecaster(hidden=8, layers=3)
    assert (model.context, model.carry_size) == (1, 2 * 3 * 8)


def test_learns_to_beat_persistence(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()
    targets = np.arange(1000, 1200)
    windows = sliding_windows(series, targets, 32)
    forecast = tiny.predict(windows)
    assert forecast.shape == (200, 1)
    assert rmse(forecast[:, 0], series[targets]) < 0.5 * rmse(windows[:, -1, 0], series[targets])
    assert tiny.validation_rmse_ is not None and tiny.validation_rmse_ > 0


def test_a_level_shift_moves_every_forecast_by_the_same_amount(
    tiny: StatefulLSTMForecaster,
) -> None:
    series = noisy_wave()
    windows = sliding_windows(series, np.arange(1000, 1100), 32)
    base = tiny.predict(windows)
    np.testing.assert_allclose(tiny.predict(windows + 500.0), base + 500.0, rtol=0, atol=1e-6)
    streamed, _ = stream(tiny, series[900:1100])
    shifted, _ = stream(tiny, series[900:1100] + 500.0)
    np.testing.assert_allclose(shifted, streamed + 500.0, rtol=0, atol=1e-6)


def test_a_window_forecast_is_a_fresh_streams_forecast_bit_for_bit(
    tiny: StatefulLSTMForecaster,
) -> None:
    """Offline evaluation and live streaming are one recurrence: a window's forecast is what a
    stream that starts afresh at the window's first reading forecasts after its last."""
    series = noisy_wave()
    targets = np.arange(1000, 1200, 17)
    windowed = tiny.predict(sliding_windows(series, targets, 32))
    for row, target in enumerate(targets):
        streamed, _ = stream(tiny, series[target - 32 : target])
        np.testing.assert_array_equal(streamed[-1], windowed[row])


def test_a_fresh_stream_first_steps_with_no_change(tiny: StatefulLSTMForecaster) -> None:
    """A NaN history (a stream starting afresh) reads as a previous reading equal to the first."""
    rows = noisy_wave(50)[None, :, None]
    fresh, fresh_carry = tiny.advance(np.full((1, 1, 1), np.nan), rows, tiny.initial_carry(1))
    same, same_carry = tiny.advance(rows[:, :1], rows, tiny.initial_carry(1))
    np.testing.assert_array_equal(fresh, same)
    np.testing.assert_array_equal(fresh_carry, same_carry)
    assert fresh_carry.dtype == np.float32 and fresh_carry.shape == (1, tiny.carry_size)


def test_the_graph_runs_the_trained_network(tiny: StatefulLSTMForecaster) -> None:
    """The exported graph against torch's forward of the same weights (saturating gates
    included), and the carry laid out as h then c."""
    torch = pytest.importorskip("torch")
    from app.forecasting import networks

    network = tiny._new_network()
    networks.load_weights(network, tiny.weights_)
    rng = np.random.default_rng(5)
    streams, steps = 7, 40
    rows = np.cumsum(rng.normal(scale=30.0, size=(streams, steps, 1)), axis=1)
    history = rng.normal(size=(streams, 1, 1))
    carry = rng.normal(size=(streams, tiny.carry_size)).astype(np.float32)
    forecasts, after = tiny.advance(history, rows, carry)
    changes = np.diff(np.concatenate((history, rows), axis=1), axis=1) / tiny.diff_std_
    state = carry.reshape(streams, 2, tiny.layers, tiny.hidden).transpose(1, 2, 0, 3)
    with torch.inference_mode():
        out, (h, c) = network.sequence(
            torch.from_numpy(changes.astype(np.float32)),
            (torch.from_numpy(state[0].copy()), torch.from_numpy(state[1].copy())),
        )
    expected = rows + out.numpy().astype(np.float64) * tiny.diff_std_[0]
    np.testing.assert_allclose(forecasts, expected, rtol=0, atol=1e-4)
    expected_carry = np.concatenate(
        (
            h.numpy().transpose(1, 0, 2).reshape(streams, -1),
            c.numpy().transpose(1, 0, 2).reshape(streams, -1),
        ),
        axis=1,
    )
    np.testing.assert_allclose(after, expected_carry, rtol=0, atol=1e-5)


def test_advance_leaves_its_arguments_alone(tiny: StatefulLSTMForecaster) -> None:
    rows = noisy_wave(30)[None, :, None]
    history = np.full((1, 1, 1), np.nan)
    carry = tiny.initial_carry(1)
    tiny.advance(history, rows, carry)
    assert np.isnan(history).all() and not carry.any()
    np.testing.assert_array_equal(rows[0, :, 0], noisy_wave(30))


def test_the_future_cannot_change_a_forecast(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()[:400]
    before, _ = stream(tiny, series)
    spoiled = series.copy()
    spoiled[250:] += 100.0 * np.random.default_rng(1).normal(size=150)
    after, _ = stream(tiny, spoiled)
    # Row j is made after reading j: rows up to 249 read nothing from sample 250 on.
    np.testing.assert_array_equal(after[:250], before[:250])
    assert not np.allclose(after[250:], before[250:])


def test_training_reads_nothing_after_train_end() -> None:
    series = noisy_wave(800)
    spoiled = series.copy()
    spoiled[600:] = 1e6
    config = TrainingConfig(epochs=2, batch_size=4, validation=50)
    clean = StatefulLSTMForecaster(window=16, hidden=8, sequence=16, training=config)
    blind = StatefulLSTMForecaster(window=16, hidden=8, sequence=16, training=config)
    clean.fit(series[:600])
    blind.fit(spoiled, train_end=600)
    np.testing.assert_array_equal(blind.diff_std_, clean.diff_std_)
    windows = sliding_windows(series, np.arange(600, 700), 16)
    np.testing.assert_array_equal(blind.predict(windows), clean.predict(windows))
    assert not np.array_equal(
        clean.predict(windows),
        StatefulLSTMForecaster(
            window=16,
            hidden=8,
            sequence=16,
            training=TrainingConfig(**{**config.to_dict(), "seed": 1}),
        )
        .fit(series[:600])
        .predict(windows),
    )


def test_direct_multi_step_forecasts_every_step(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()
    model = StatefulLSTMForecaster(window=32, hidden=8, sequence=32, horizon=3, training=TINY)
    model.fit(series, train_end=1000)
    windows = sliding_windows(series, np.arange(1000, 1050), 32)
    assert model.predict(windows).shape == (50, 3)
    streamed, _ = stream(model, series[:1050])
    assert streamed.shape == (1050, 3)


def test_the_artifact_round_trip_keeps_forecasts_and_streaming(
    tiny: StatefulLSTMForecaster, tmp_path: Path
) -> None:
    save_model(tiny, tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    model = loaded.forecaster
    assert isinstance(model, StatefulLSTMForecaster)
    assert loaded.manifest["kind"] == "lstm-stateful"
    assert loaded.manifest["parameter_count"] == tiny.n_parameters
    series = noisy_wave()
    windows = sliding_windows(series, np.arange(1000, 1100), 32)
    np.testing.assert_array_equal(model.predict(windows), tiny.predict(windows))
    np.testing.assert_array_equal(stream(model, series[:300])[0], stream(tiny, series[:300])[0])
    assert model.config() == tiny.config()
    assert build_forecaster(tiny.config()).kind == "lstm-stateful"


def test_an_unfitted_model_is_not_saved_and_does_not_forecast(tmp_path: Path) -> None:
    model = StatefulLSTMForecaster(window=16, hidden=8)
    with pytest.raises(ArtifactError, match="not been fitted"):
        save_model(model, tmp_path / "model")
    with pytest.raises(RuntimeError, match="fitted"):
        model.advance(np.zeros((1, 1, 1)), np.zeros((1, 1, 1)), model.initial_carry(1))


def test_refit_trains_on_the_whole_period_for_the_chosen_epochs() -> None:
    series = noisy_wave(800)
    config = TrainingConfig(epochs=3, batch_size=4, validation=100, refit=True)
    model = StatefulLSTMForecaster(window=16, hidden=8, sequence=16, training=config)
    model.fit(series, train_end=700)
    np.testing.assert_allclose(model.diff_std_, [np.diff(series[:700]).std()], rtol=1e-12)
    assert model.validation_rmse_ is not None
    windows = sliding_windows(series, np.arange(700, 800), 16)
    assert rmse(model.predict(windows)[:, 0], series[700:800]) < rmse(
        windows[:, -1, 0], series[700:800]
    )
