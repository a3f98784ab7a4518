from __future__ import annotations

import math

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.scores import mae, mase, mean_error, naive_scale, rmse, rmse_per_step


def test_scores_match_hand_computed_values() -> None:
    forecast = np.array([1.0, 2.0, 3.0])
    actual = np.array([2.0, 2.0, 5.0])  # errors -1, 0, -2
    assert rmse(forecast, actual) == pytest.approx(math.sqrt(5 / 3))
    assert mae(forecast, actual) == pytest.approx(1.0)
    assert mean_error(forecast, actual) == pytest.approx(-1.0)  # forecast minus actual: low


def test_mase_scales_by_the_in_sample_naive_error_of_the_training_values() -> None:
    train = np.array([0.0, 1.0, 3.0, 2.0])  # naive one-step errors 1, 2, 1 -> scale 4/3
    assert naive_scale(train) == pytest.approx(4 / 3)
    forecast, actual = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 5.0])  # MAE 1
    assert mase(forecast, actual, train_values=train) == pytest.approx(0.75)


def test_rmse_per_step_keeps_the_horizon_axis() -> None:
    forecast = np.array([[1.0, 2.0], [3.0, 4.0]])
    actual = np.array([[1.0, 0.0], [0.0, 4.0]])  # step errors (0, 3) and (2, 0)
    np.testing.assert_allclose(rmse_per_step(forecast, actual), [math.sqrt(4.5), math.sqrt(2.0)])
    # pooled over steps it is the plain RMSE: one formula, two views
    assert rmse(forecast, actual) == pytest.approx(math.sqrt(13 / 4))
    np.testing.assert_allclose(rmse_per_step(forecast[:, 0], actual[:, 0]), [math.sqrt(4.5)])


def test_mismatched_or_empty_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        rmse(np.zeros(3), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="nothing to score"):
        mae(np.zeros(0), np.zeros(0))


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (np.full(10, 2.5), "constant"),
        (np.array([0.0, np.nan, 1.0]), "NaN"),
    ],
)
def test_mase_is_undefined_on_unusable_training_values(train: np.ndarray, message: str) -> None:
    with pytest.raises(DataError, match=message):
        mase(np.zeros(2), np.ones(2), train_values=train)
