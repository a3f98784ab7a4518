from __future__ import annotations

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.baselines import Naive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.windows import sliding_windows, target_matrix
from app.series import Series


def test_a_straight_line_is_continued_exactly_at_every_horizon() -> None:
    line = 2.0 + 0.3 * np.arange(100)
    model = LinearAR(window=4, horizon=3).fit(line)
    forecast = model.predict(np.array([10.0, 10.3, 10.6, 10.9])[None, :, None])
    np.testing.assert_allclose(forecast, [[11.2, 11.5, 11.8]], atol=1e-9)


def test_recovers_the_coefficients_of_an_ar_process_in_differences() -> None:
    # d_t = 0.5 d_{t-1} + e_t, x = cumsum(d): x_t - x_{t-1} = -0.5 (x_{t-2} - x_{t-1}) + e_t.
    rng = np.random.default_rng(1)
    noise = rng.normal(size=20_000)
    change = np.zeros_like(noise)
    for t in range(1, noise.size):
        change[t] = 0.5 * change[t - 1] + noise[t]
    model = LinearAR(window=3).fit(np.cumsum(change))
    assert model.coef_.shape == (3, 1, 1)
    np.testing.assert_allclose(model.coef_[:, 0, 0], [0.0, -0.5, 0.0], atol=0.02)
    assert abs(model.intercept_[0]) < 0.03


def test_the_forecast_moves_with_the_level() -> None:
    rng = np.random.default_rng(2)
    model = LinearAR(window=8, horizon=2).fit(np.cumsum(rng.normal(size=500)))
    windows = rng.normal(size=(5, 8, 1))
    np.testing.assert_allclose(
        model.predict(windows + 900.0), model.predict(windows) + 900.0, atol=1e-9
    )


def test_a_leading_second_channel_is_used() -> None:
    rng = np.random.default_rng(3)
    lead = rng.normal(size=3000)
    target = np.concatenate([[0.0], lead[:-1]]) + 0.05 * rng.normal(size=3000)
    data = np.stack([target, lead], axis=1)
    targets = np.arange(2500, 3000)
    errors = {}
    for channels in (1, 2):
        model = LinearAR(window=8, n_channels=channels).fit(data[:, :channels], train_end=2500)
        forecast = model.predict(sliding_windows(data[:, :channels], targets, 8))[:, 0]
        errors[channels] = np.sqrt(np.mean((forecast - target[targets]) ** 2))
    assert errors[2] < 0.1 < errors[1]


def test_beats_naive_on_the_reference_twin(seed0: Series) -> None:
    data = seed0.matrix(["value"])
    targets = np.arange(6000, 7000)
    windows = sliding_windows(data, targets, 64)
    actual = target_matrix(data[:, 0], targets, 1)
    linear = LinearAR().fit(data, train_end=6000).predict(windows)
    naive = Naive(window=64).predict(windows)
    rmse_linear = np.sqrt(np.mean((linear - actual) ** 2))
    # The recurrent-forecaster teaching lab this project follows reports 0.151 at origin 6000.
    assert rmse_linear < 0.17
    assert rmse_linear < 0.5 * np.sqrt(np.mean((naive - actual) ** 2))


def test_reads_nothing_after_train_end(seed0: Series) -> None:
    data = seed0.matrix(["value"])[:3000]
    spoiled = data.copy()
    spoiled[2000:] = np.nan
    clean = LinearAR(window=16).fit(data, train_end=2000)
    blind = LinearAR(window=16).fit(spoiled, train_end=2000)
    np.testing.assert_array_equal(clean.coef_, blind.coef_)
    np.testing.assert_array_equal(clean.intercept_, blind.intercept_)


def test_missing_readings_in_the_training_part_are_refused() -> None:
    data = np.arange(300.0)
    data[123] = np.nan
    with pytest.raises(DataError, match="first at sample 123"):
        LinearAR(window=8).fit(data, train_end=200)


def test_predicting_before_fitting_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="fitted"):
        LinearAR(window=4).predict(np.zeros((1, 4, 1)))
