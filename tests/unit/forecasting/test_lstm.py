from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from app.errors import DataError
from app.forecasting.lstm import GlobalLSTMForecaster, LSTMForecaster
from app.forecasting.training import TrainingConfig
from app.forecasting.windows import sliding_windows, target_matrix

TINY = TrainingConfig(epochs=3, batch_size=32, lr=1e-2, validation=100)


def noisy_wave(samples: int = 1200, seed: int = 0) -> np.ndarray:
    """A period-11 oscillation on a drifting level, like the twin but cheap."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples)
    return np.sin(2 * np.pi * t / 11) + 1e-3 * t + 0.05 * rng.normal(size=samples)


@pytest.fixture(scope="module")
def tiny() -> LSTMForecaster:
    return LSTMForecaster(window=16, hidden=8, training=TINY).fit(noisy_wave(), train_end=1000)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def test_the_spec_architecture_has_12961_parameters() -> None:
    assert LSTMForecaster().n_parameters == 12_961
    # Extra input channels widen the first layer only; the head grows with the horizon.
    assert LSTMForecaster(n_channels=2, horizon=20).n_parameters == 12_961 + 4 * 32 + 19 * 33


def test_forget_gates_start_open() -> None:
    module = LSTMForecaster()._new_network()
    for layer in range(2):
        ih = getattr(module.lstm, f"bias_ih_l{layer}").detach().numpy()
        hh = getattr(module.lstm, f"bias_hh_l{layer}").detach().numpy()
        np.testing.assert_array_equal((ih + hh)[32:64], 1.0)


def test_learns_to_beat_persistence(tiny: LSTMForecaster) -> None:
    series = noisy_wave()
    targets = np.arange(1000, 1200)
    windows = sliding_windows(series, targets, 16)
    actual = series[targets]
    assert rmse(tiny.predict(windows)[:, 0], actual) < 0.5 * rmse(windows[:, -1, 0], actual)


def test_per_window_forecast_follows_any_level(tiny: LSTMForecaster) -> None:
    series = noisy_wave()
    windows = sliding_windows(series, np.arange(1000, 1100), 16)
    base = tiny.predict(windows)
    for level in (500.0, 900.0, -3000.0):
        shifted = tiny.predict(windows + level)
        assert np.max(np.abs(shifted - level - base)) < 1e-6 * series.std()


def test_the_global_model_does_not_follow_the_level() -> None:
    model = GlobalLSTMForecaster(window=16, hidden=8, training=TINY)
    model.fit(noisy_wave(), train_end=1000)
    windows = sliding_windows(noisy_wave(), np.arange(1000, 1100), 16)
    # Saturated units: far outside the training range the forecast stops moving with the input.
    assert np.all(model.predict(windows + 500.0) < windows[:, -1:, 0] + 400.0)


def test_global_normalisation_is_its_own_kind() -> None:
    model = GlobalLSTMForecaster(window=8)
    assert model.kind == "lstm-global"
    assert model.config()["normalisation"] == "global"
    assert copy.deepcopy(model).kind == "lstm-global"
    assert LSTMForecaster(window=8).kind == "lstm"
    assert LSTMForecaster(window=8).config()["normalisation"] == "per_window"


def test_the_graph_runs_the_trained_network(tiny: LSTMForecaster) -> None:
    from app.forecasting import networks
    from app.forecasting.normalisation import encode_inputs

    network = tiny._new_network()
    networks.load_weights(network, tiny.weights_)
    windows = sliding_windows(noisy_wave(), np.arange(1000, 1200), 16)
    inputs = encode_inputs(windows, tiny.mean_, tiny.std_, "per_window")
    with torch.inference_mode():
        out = network(torch.from_numpy(inputs)).numpy().astype(np.float64)
    expected = windows[:, -1, 0:1] + out * tiny.std_[0]
    np.testing.assert_allclose(tiny.predict(windows), expected, rtol=0, atol=1e-5)


def test_a_fitted_model_survives_a_copy(tiny: LSTMForecaster) -> None:
    windows = sliding_windows(noisy_wave(), np.arange(1000, 1050), 16)
    np.testing.assert_array_equal(copy.deepcopy(tiny).predict(windows), tiny.predict(windows))


def test_batch_size_does_not_change_the_forecast() -> None:
    series = noisy_wave(2000)
    model = LSTMForecaster(training=TrainingConfig(epochs=1, validation=100))
    model.fit(series, train_end=1000)
    windows = sliding_windows(series, np.arange(1000, 2000), 64)
    together = model.predict(windows)  # one batch of 1000
    rows = np.arange(0, 1000, 7)
    alone = np.concatenate([model.predict(windows[i : i + 1]) for i in rows])  # batches of 1
    np.testing.assert_allclose(together[rows], alone, rtol=0, atol=1e-6)


def test_training_is_reproducible_and_the_seed_matters() -> None:
    series = noisy_wave(600)
    windows = sliding_windows(series, np.arange(500, 600), 16)

    def fit(seed: int) -> np.ndarray:
        config = TrainingConfig(epochs=2, batch_size=32, validation=50, seed=seed)
        model = LSTMForecaster(window=16, hidden=8, training=config)
        return model.fit(series, train_end=500).predict(windows)

    np.testing.assert_array_equal(fit(0), fit(0))
    assert not np.array_equal(fit(0), fit(1))


def test_statistics_and_weights_come_from_the_training_part_only() -> None:
    series = noisy_wave(800)
    spoiled = series.copy()
    spoiled[600:] = 1e6  # a wild future must not move anything learned
    clean = LSTMForecaster(window=16, hidden=8, training=TINY).fit(series[:600])
    blind = LSTMForecaster(window=16, hidden=8, training=TINY).fit(spoiled, train_end=600)
    assert clean.mean_[0] == pytest.approx(series[:600].mean(), abs=1e-12)
    assert clean.std_[0] == pytest.approx(series[:600].std(), abs=1e-12)
    np.testing.assert_array_equal(blind.mean_, clean.mean_)
    np.testing.assert_array_equal(blind.std_, clean.std_)
    windows = sliding_windows(series, np.arange(600, 700), 16)
    np.testing.assert_array_equal(blind.predict(windows), clean.predict(windows))


def test_causal_a_forecast_ignores_readings_after_its_origin(tiny: LSTMForecaster) -> None:
    series = noisy_wave()
    before = tiny.predict(sliding_windows(series, np.array([1050]), 16))
    changed = series.copy()
    changed[1050:] += 10.0
    after = tiny.predict(sliding_windows(changed, np.array([1050]), 16))
    np.testing.assert_array_equal(before, after)


def test_history_logs_the_gradient_norm_and_keeps_the_best_epoch(tiny: LSTMForecaster) -> None:
    assert [int(h["epoch"]) for h in tiny.history_] == [1, 2, 3]
    for record in tiny.history_:
        assert 0 < record["grad_norm_mean"] <= record["grad_norm_max"]
        assert math.isfinite(record["val_loss"])
    # The kept weights are those of the best validation epoch: rescoring the block agrees.
    series = noisy_wave()
    targets = np.arange(1000 - 100, 1000)
    forecast = tiny.predict(sliding_windows(series, targets, 16))
    actual = target_matrix(series, targets, 1)
    best = min(h["val_loss"] for h in tiny.history_)
    assert tiny.validation_rmse_ == pytest.approx(math.sqrt(best) * tiny.std_[0], rel=1e-9)
    assert rmse(forecast, actual) == pytest.approx(tiny.validation_rmse_, rel=1e-5)


def test_a_leading_second_channel_helps() -> None:
    rng = np.random.default_rng(0)
    samples = 1500
    lead = np.convolve(rng.normal(size=samples), np.ones(3) / 3, mode="same")
    target = np.concatenate([[0.0, 0.0], lead[:-2]]) + 0.05 * rng.normal(size=samples)
    data = np.stack([target, lead], axis=1)
    targets = np.arange(1200, samples)
    config = TrainingConfig(epochs=10, batch_size=32, lr=1e-2, validation=100)
    errors = {}
    for channels in (1, 2):
        model = LSTMForecaster(window=16, hidden=16, n_channels=channels, training=config)
        model.fit(data[:, :channels], train_end=1200)
        forecast = model.predict(sliding_windows(data[:, :channels], targets, 16))[:, 0]
        errors[channels] = rmse(forecast, target[targets])
    assert errors[2] < 0.5 * errors[1]


def test_direct_multi_step_outputs_one_column_per_step() -> None:
    series = noisy_wave(800)
    model = LSTMForecaster(window=16, hidden=8, horizon=5, training=TINY).fit(series, train_end=700)
    assert model.predict(sliding_windows(series, np.arange(700, 710), 16)).shape == (10, 5)


def test_bad_training_data_is_refused() -> None:
    series = noisy_wave(600)
    series[100] = np.nan
    model = LSTMForecaster(window=16, hidden=8, training=TINY)
    with pytest.raises(DataError, match="first at sample 100"):
        model.fit(series, train_end=500)
    with pytest.raises(DataError, match="too small"):
        model.fit(noisy_wave(600), train_end=110)
    with pytest.raises(DataError, match=r"reads 1 channel.*has 2"):
        model.fit(np.zeros((600, 2)), train_end=500)


def test_refit_retrains_on_the_whole_period_for_the_chosen_epochs() -> None:
    series = noisy_wave(800)
    windows = sliding_windows(series, np.arange(700, 800), 16)
    picked = LSTMForecaster(window=16, hidden=8, training=TINY).fit(series, train_end=700)
    config = TrainingConfig(epochs=3, batch_size=32, lr=1e-2, validation=100, refit=True)
    refitted = LSTMForecaster(window=16, hidden=8, training=config).fit(series, train_end=700)
    # Same selection run (same history and validation score), different final weights.
    assert refitted.history_ == picked.history_
    assert refitted.validation_rmse_ == picked.validation_rmse_
    assert not np.array_equal(refitted.predict(windows), picked.predict(windows))


def test_fitting_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    LSTMForecaster(window=16, hidden=8, training=TINY).fit(noisy_wave(400))
    np.testing.assert_array_equal(torch.rand(3), expected)
