from __future__ import annotations

import numpy as np
import pytest

from app.forecasting.baselines import Naive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.multistep import recursive_forecast
from app.forecasting.windows import sliding_windows, target_matrix
from app.series import Series


def test_each_step_feeds_the_previous_forecast_back() -> None:
    line = 2.0 + 0.3 * np.arange(100)
    one_step = LinearAR(window=4).fit(line)
    windows = np.array([10.0, 10.3, 10.6, 10.9])[None, :, None]
    np.testing.assert_allclose(
        recursive_forecast(one_step, windows, 3), [[11.2, 11.5, 11.8]], atol=1e-9
    )


def test_recursive_naive_repeats_the_last_reading() -> None:
    windows = np.arange(12.0).reshape(2, 6, 1)
    np.testing.assert_array_equal(
        recursive_forecast(Naive(window=6), windows, 4), [[5.0] * 4, [11.0] * 4]
    )


def test_linear_recursive_matches_linear_direct_on_the_twin(seed0: Series) -> None:
    # In the reference figures of the recurrent-forecaster teaching lab this project follows,
    # linear recursive and direct agree within 0.01 at every horizon up to 20.
    data = seed0.matrix(["value"])
    targets = np.arange(6000, 6981)
    windows = sliding_windows(data, targets, 64)
    actual = target_matrix(data[:, 0], targets, 20)
    recursive = recursive_forecast(LinearAR().fit(data, train_end=6000), windows, 20)
    direct = LinearAR(horizon=20).fit(data, train_end=6000).predict(windows)
    rmse_recursive = np.sqrt(np.mean((recursive - actual) ** 2, axis=0))
    rmse_direct = np.sqrt(np.mean((direct - actual) ** 2, axis=0))
    np.testing.assert_allclose(rmse_recursive, rmse_direct, atol=0.01)
    assert rmse_recursive[19] > 2 * rmse_recursive[0]  # errors grow with the horizon


def test_only_one_step_single_channel_models_can_recurse() -> None:
    with pytest.raises(ValueError, match="one-step, single-channel"):
        recursive_forecast(Naive(window=4, horizon=2), np.zeros((1, 4, 1)), 3)
    with pytest.raises(ValueError, match="one-step, single-channel"):
        recursive_forecast(Naive(window=4, n_channels=2), np.zeros((1, 4, 2)), 3)
    with pytest.raises(ValueError, match="steps"):
        recursive_forecast(Naive(window=4), np.zeros((1, 4, 1)), 0)
