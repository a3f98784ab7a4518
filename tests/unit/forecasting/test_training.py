from __future__ import annotations

import numpy as np
import pytest

from app.errors import AppError, DataError
from app.forecasting.linear_ar import LinearAR
from app.forecasting.training import (
    TrainingConfig,
    holdout_metrics,
    split_targets,
    training_part,
)
from app.series import Series


@pytest.mark.parametrize("horizon", [1, 5, 20])
def test_the_validation_block_ends_the_training_period_with_a_gap(horizon: int) -> None:
    split = split_targets(6000, window=64, horizon=horizon, validation=500)
    assert split.validation.size == 500
    # Every validation target lies before train_end, the last one right before it.
    assert split.validation[-1] + horizon - 1 == 5999
    assert split.train[0] == 64
    last_train_target = split.train[-1] + horizon - 1
    if horizon == 1:
        assert split.validation[0] == last_train_target + 1
    else:
        assert split.validation[0] - last_train_target > horizon


def test_without_validation_every_window_trains() -> None:
    split = split_targets(1000, window=64, horizon=3, validation=0)
    np.testing.assert_array_equal(split.train, np.arange(64, 998))
    assert split.validation.size == 0


@pytest.mark.parametrize("horizon", [1, 4])
def test_the_smallest_usable_train_end_is_the_one_the_error_names(horizon: int) -> None:
    with pytest.raises(DataError, match=r"at least (\d+)") as info:
        split_targets(100, window=64, horizon=horizon, validation=50)
    needed = int(info.value.detail.rsplit(" ", 1)[1])
    assert split_targets(needed, window=64, horizon=horizon, validation=50).train.size == 1
    with pytest.raises(DataError):
        split_targets(needed - 1, window=64, horizon=horizon, validation=50)


def test_training_part_refuses_what_training_cannot_use() -> None:
    data = np.ones((100, 2))
    data[70, 1] = np.nan
    with pytest.raises(DataError, match="first at sample 70, channel 1"):
        training_part(data, 80, n_channels=2)
    assert training_part(data, 70, n_channels=2)[1] == 70  # NaN after train_end is fine
    with pytest.raises(DataError, match="outside the data"):
        training_part(data, 101, n_channels=2)
    with pytest.raises(DataError, match="reads 1 channel"):
        training_part(data, 50, n_channels=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch size"),
        ({"lr": 0.0}, "lr"),
        ({"validation": -1}, "validation"),
        ({"patience": 0}, "patience"),
        ({"refit": True, "validation": 0}, "refit"),
    ],
)
def test_a_bad_recipe_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(AppError, match=message):
        TrainingConfig(**fields)  # type: ignore[arg-type]


def test_holdout_metrics_score_validation_and_the_next_1000_samples(seed0: Series) -> None:
    data = seed0.matrix(["value"])
    model = LinearAR().fit(data, train_end=6000)
    metrics = holdout_metrics(model, data, 6000, validation=500)
    assert metrics["validation_samples"] == 500
    assert 0.1 < metrics["validation_rmse"] < 0.2
    test = metrics["test"]
    assert (test["start"], test["samples"]) == (6000, 1000)
    assert test["rmse"] < 0.5 * test["naive_rmse"]
    assert "test" not in holdout_metrics(model, data[:6000], 6000, validation=500)


def test_holdout_metrics_give_each_horizon_step(seed0: Series) -> None:
    data = seed0.matrix(["value"])[:7000]
    model = LinearAR(horizon=3).fit(data, train_end=6000)
    test = holdout_metrics(model, data, 6000, validation=200)["test"]
    assert len(test["rmse_by_step"]) == 3
    assert test["rmse_by_step"][0] < test["rmse_by_step"][2]
    assert test["samples"] == 998  # the last two origins have no full 3-step target
