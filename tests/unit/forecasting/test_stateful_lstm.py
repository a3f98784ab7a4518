from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.errors import ArtifactError, DataError
from app.forecasting.artifacts import build_forecaster, load_model, save_model
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import (
    NUMPY_STEP_LIMIT,
    ONNX_STEP_LIMIT,
    LSTMState,
    StatefulLSTMForecaster,
    state_from_json,
    state_to_json,
)
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


def test_has_the_window_lstms_architecture() -> None:
    assert StatefulLSTMForecaster().n_parameters == LSTMForecaster().n_parameters == 12_961


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
    streamed, _ = tiny.run(series[900:1100])
    shifted, _ = tiny.run(series[900:1100] + 500.0)
    np.testing.assert_allclose(shifted, streamed + 500.0, rtol=0, atol=1e-6)


def test_stepping_one_reading_at_a_time_equals_the_batched_run(
    tiny: StatefulLSTMForecaster,
) -> None:
    series = noisy_wave()[:300]
    batched, final = tiny.run(series)
    state = tiny.initial_state(1)
    stepped = []
    for t in range(1, series.size):
        forecast, state = tiny.step(state, series[t - 1 : t], series[t : t + 1])
        stepped.append(forecast[0])
    np.testing.assert_allclose(np.array(stepped), batched, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state.h, final.h, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state.c, final.c, rtol=0, atol=1e-6)


def test_a_run_resumes_where_another_left_off(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()[:300]
    whole, _ = tiny.run(series)
    first, state = tiny.run(series[:150])
    second, _ = tiny.run(series[149:], state)  # the next run starts from the last reading
    np.testing.assert_allclose(np.concatenate([first, second]), whole, rtol=0, atol=1e-6)


def test_streams_stepped_together_equal_each_stepped_alone(
    tiny: StatefulLSTMForecaster,
) -> None:
    streams = np.stack([noisy_wave(120, seed=s) + 10.0 * s for s in range(5)], axis=1)  # (T, 5)
    together = tiny.initial_state(5)
    alone = [tiny.initial_state(1) for _ in range(5)]
    for t in range(1, streams.shape[0]):
        batch, together = tiny.step(together, streams[t - 1], streams[t])
        for s in range(5):
            single, alone[s] = tiny.step(alone[s], streams[t - 1, s : s + 1], streams[t, s : s + 1])
            np.testing.assert_allclose(batch[s], single[0], rtol=0, atol=1e-6)
    merged = LSTMState.stack(alone)
    np.testing.assert_allclose(merged.h, together.h, rtol=0, atol=1e-6)
    np.testing.assert_allclose(together.select([3]).c, alone[3].c, rtol=0, atol=1e-6)


def test_a_large_batch_of_streams_equals_each_stream_alone(
    tiny: StatefulLSTMForecaster,
) -> None:
    """Many streams take torch's fused step, one stream ONNX Runtime's: the results agree."""
    count = ONNX_STEP_LIMIT + 22
    rng = np.random.default_rng(3)
    streams = np.cumsum(rng.normal(size=(40, count)), axis=0)  # (T, streams)
    together = tiny.initial_state(count)
    for t in range(1, streams.shape[0]):
        batch, together = tiny.step(together, streams[t - 1], streams[t])
    for s in (0, 77, count - 1):
        alone, state = tiny.run(streams[:, s])
        np.testing.assert_allclose(batch[s], alone[-1], rtol=0, atol=1e-6)
        np.testing.assert_allclose(together.select([s]).h, state.h, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "streams", [1, NUMPY_STEP_LIMIT - 1, NUMPY_STEP_LIMIT, ONNX_STEP_LIMIT - 1, ONNX_STEP_LIMIT]
)
def test_every_way_of_stepping_agrees_with_torchs_lstm(
    tiny: StatefulLSTMForecaster, streams: int
) -> None:
    """A few streams are stepped in numpy, more by ONNX Runtime, many by nn.LSTM: one network
    either side of each limit, saturating gates included."""
    rng = np.random.default_rng(streams)
    state = tiny.initial_state(streams)
    state.h[:] = rng.normal(size=state.h.shape)
    state.c[:] = rng.normal(size=state.c.shape)
    previous = np.zeros((streams, 1))
    current = rng.normal(scale=30.0, size=(streams, 1))
    forecast, after = tiny.step(state, previous, current)
    x = torch.from_numpy((current / tiny.diff_std_).astype(np.float32))
    with torch.inference_mode():
        start = (torch.from_numpy(state.h), torch.from_numpy(state.c))
        out, (h, c) = tiny.module_.sequence(x[:, None], start)
    expected = current[:, 0, None] + out[:, 0].numpy().astype(np.float64) * tiny.diff_std_[0]
    np.testing.assert_allclose(forecast, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(after.h, h.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(after.c, c.numpy(), rtol=0, atol=1e-5)


def test_a_window_forecast_is_a_stream_run_over_that_window(
    tiny: StatefulLSTMForecaster,
) -> None:
    """Offline evaluation and live streaming are one recurrence: a window's forecast is what a
    fresh stream that received exactly the window's readings forecasts."""
    series = noisy_wave()
    targets = np.arange(1000, 1200, 17)
    windowed = tiny.predict(sliding_windows(series, targets, 32))
    for row, target in enumerate(targets):
        streamed, _ = tiny.run(series[target - 32 : target])
        np.testing.assert_allclose(streamed[-1], windowed[row], rtol=0, atol=1e-6)


def test_step_leaves_the_given_state_alone(tiny: StatefulLSTMForecaster) -> None:
    state = tiny.initial_state(2)
    _, state = tiny.step(state, np.array([0.0, 1.0]), np.array([0.5, 0.7]))
    before = LSTMState(h=state.h.copy(), c=state.c.copy())
    tiny.step(state, np.array([0.5, 0.7]), np.array([0.9, 0.2]))
    np.testing.assert_array_equal(state.h, before.h)
    np.testing.assert_array_equal(state.c, before.c)


def test_the_state_survives_json_exactly(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()[:200]
    _, state = tiny.run(series)
    restored = state_from_json(json.loads(json.dumps(state_to_json(state))))
    np.testing.assert_array_equal(restored.h, state.h)
    np.testing.assert_array_equal(restored.c, state.c)
    assert restored.h.dtype == np.float32
    after, _ = tiny.step(restored, series[-1:], np.array([1.5]))
    expected, _ = tiny.step(state, series[-1:], np.array([1.5]))
    np.testing.assert_array_equal(after, expected)


def test_a_malformed_state_is_refused() -> None:
    good = state_to_json(
        LSTMState(h=np.zeros((2, 1, 4), np.float32), c=np.ones((2, 1, 4), np.float32))
    )
    for broken in (
        {**good, "h": good["h"][:-1]},
        {**good, "format": 99},
        {key: value for key, value in good.items() if key != "c"},
        {**good, "c": [float("nan")] * 8},
    ):
        with pytest.raises(ArtifactError):
            state_from_json(broken)


def test_a_missing_reading_is_refused_before_it_poisons_the_state(
    tiny: StatefulLSTMForecaster,
) -> None:
    with pytest.raises(DataError, match="non-finite"):
        tiny.step(tiny.initial_state(1), np.array([1.0]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"\(3, 1\)"):
        tiny.step(tiny.initial_state(3), np.zeros(2), np.zeros(2))


def test_the_future_cannot_change_a_forecast(tiny: StatefulLSTMForecaster) -> None:
    series = noisy_wave()[:400]
    before, _ = tiny.run(series)
    spoiled = series.copy()
    spoiled[250:] += 100.0 * np.random.default_rng(1).normal(size=150)
    after, _ = tiny.run(spoiled)
    # Row j is made after reading j + 1: rows up to 248 read nothing from sample 250 on.
    np.testing.assert_array_equal(after[:249], before[:249])
    assert not np.allclose(after[249:], before[249:])


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
    streamed, _ = model.run(series[:1050])
    assert streamed.shape == (1049, 3)


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
    np.testing.assert_array_equal(model.run(series[:300])[0], tiny.run(series[:300])[0])
    assert model.config() == tiny.config()
    assert build_forecaster(tiny.config()).kind == "lstm-stateful"


def test_an_unfitted_model_is_not_saved_and_does_not_forecast(tmp_path: Path) -> None:
    model = StatefulLSTMForecaster(window=16, hidden=8)
    with pytest.raises(ArtifactError, match="not been fitted"):
        save_model(model, tmp_path / "model")
    with pytest.raises(RuntimeError, match="fitted"):
        model.step(model.initial_state(1), np.zeros(1), np.zeros(1))


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
