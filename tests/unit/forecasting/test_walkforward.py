from __future__ import annotations

import math
from typing import Self

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.multistep import recursive_forecast
from app.forecasting.training import TrainingConfig
from app.forecasting.walkforward import (
    MethodFactory,
    RecursiveForecaster,
    check_origins,
    evaluate_origin,
    summarise,
    walk_forward,
)
from app.series import Series


def baselines(horizon: int = 1) -> dict[str, MethodFactory]:
    return {
        "naive": lambda: Naive(window=64, horizon=horizon),
        "seasonal_naive": lambda: SeasonalNaive(period=50, window=64, horizon=horizon),
    }


BASELINES = baselines()


class TrainingMean(Forecaster):
    """Stand-in with a learned attribute: forecasts the mean of what it was fitted on, records
    what it saw, and scribbles over its input to prove the evaluation hands it a copy."""

    kind = "training-mean"
    seen: list[np.ndarray] = []  # noqa: RUF012  (a class-level log shared by the test)

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        part = series[:train_end]
        TrainingMean.seen.append(part.copy())
        self.mean_ = float(part[:, 0].mean())
        part[:] = 1e12
        return self

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        return np.full((windows.shape[0], self.horizon), self.mean_)


def _ramp_with_two_slopes() -> np.ndarray:
    """x[i] - x[i-1] is 1 before sample 300 and 3 from it on."""
    steps = np.where(np.arange(600) < 300, 1.0, 3.0)
    return np.cumsum(steps)


def test_baselines_score_exactly_as_worked_by_hand() -> None:
    x = 2.0 * np.arange(400)  # a ramp: naive is always 2 low, seasonal naive 100 low
    fold = evaluate_origin(x, 200, BASELINES, test_size=100)
    naive, seasonal = fold.scores["naive"], fold.scores["seasonal_naive"]
    assert (naive.rmse, naive.mae, naive.mean_error) == pytest.approx((2.0, 2.0, -2.0))
    assert naive.mase == pytest.approx(1.0)  # the training naive error is 2 as well
    assert (seasonal.rmse, seasonal.mean_error) == pytest.approx((100.0, -100.0))
    assert seasonal.mase == pytest.approx(50.0)
    np.testing.assert_array_equal(fold.targets, np.arange(200, 300))
    np.testing.assert_array_equal(fold.actual[:, 0], x[200:300])


def test_seasonal_naive_is_exact_on_a_signal_of_its_period() -> None:
    periodic = np.tile(np.random.default_rng(0).normal(size=50), 12)
    fold = evaluate_origin(periodic, 400, baselines(20), test_size=150, horizon=20)
    assert fold.scores["seasonal_naive"].rmse == pytest.approx(0.0, abs=1e-12)
    assert fold.scores["naive"].rmse > 0.5


def test_every_method_is_scored_on_the_same_targets_with_the_right_count() -> None:
    x = np.sin(np.arange(800) / 3.0)
    fold = evaluate_origin(
        x,
        500,
        {**baselines(5), "mean": lambda: TrainingMean(window=64, horizon=5)},
        test_size=100,
        horizon=5,
    )
    assert fold.targets[0] == 500 and fold.targets[-1] + 4 == 599  # all 5 targets in the block
    assert fold.actual.shape == (96, 5)
    assert {f.shape for f in fold.forecasts.values()} == {(96, 5)}


def test_the_fit_sees_only_a_copy_of_the_samples_before_the_origin() -> None:
    x = np.sin(np.arange(1000) / 5.0)
    corrupted = x.copy()
    corrupted[600:] = np.nan
    TrainingMean.seen.clear()
    fold = evaluate_origin(corrupted, 600, {"mean": lambda: TrainingMean(window=64)}, test_size=100)
    (seen,) = TrainingMean.seen
    np.testing.assert_array_equal(seen[:, 0], x[:600])
    assert np.isnan(corrupted[600:]).all() and np.array_equal(corrupted[:600], x[:600])
    assert fold.train_end == 600

    # h > 1: the fit stops h samples before the origin; train_size slides the start
    TrainingMean.seen.clear()
    mean20: dict[str, MethodFactory] = {"mean": lambda: TrainingMean(window=64, horizon=20)}
    fold = evaluate_origin(x, 600, mean20, test_size=100, horizon=20, train_size=300)
    np.testing.assert_array_equal(TrainingMean.seen[0][:, 0], x[280:580])
    assert (fold.train_start, fold.train_end) == (280, 580)


def test_corrupting_everything_after_the_origin_leaves_every_fit_unchanged(seed0: Series) -> None:
    x = seed0.value[:3000]
    methods: dict[str, MethodFactory] = {"linear_ar": lambda: LinearAR(window=64)}
    clean = walk_forward(x, [2000, 2500], methods, test_size=300)
    for fold in clean:
        corrupted = x.copy()
        corrupted[fold.origin :] = 1e9
        again = evaluate_origin(corrupted, fold.origin, methods, test_size=300)
        old, new = fold.models["linear_ar"], again.models["linear_ar"]
        assert isinstance(old, LinearAR) and isinstance(new, LinearAR)
        np.testing.assert_array_equal(old.coef_, new.coef_)
        np.testing.assert_array_equal(old.intercept_, new.intercept_)
        assert again.train_range == fold.train_range


def test_an_lstm_fit_is_unchanged_by_huge_values_after_the_origin(seed0: Series) -> None:
    x = seed0.value[:900]
    tiny = TrainingConfig(epochs=1, validation=50)
    methods: dict[str, MethodFactory] = {"lstm": lambda: LSTMForecaster(hidden=8, training=tiny)}
    corrupted = x.copy()
    corrupted[600:] = 1e9
    folds = [evaluate_origin(s, 600, methods, test_size=100) for s in (x, corrupted)]
    models = [fold.models["lstm"] for fold in folds]
    assert all(isinstance(m, LSTMForecaster) for m in models)
    clean, dirty = (m for m in models if isinstance(m, LSTMForecaster))
    np.testing.assert_array_equal(clean.mean_, x[:600].mean(keepdims=True))
    np.testing.assert_array_equal(clean.std_, dirty.std_)
    for name, weights in clean.weights_.items():
        np.testing.assert_array_equal(weights, dirty.weights_[name], err_msg=name)


def test_walk_forward_summarises_folds_with_mean_and_sample_sd() -> None:
    folds = walk_forward(_ramp_with_two_slopes(), [200, 300], BASELINES, test_size=100)
    assert [f.scores["naive"].rmse for f in folds] == pytest.approx([1.0, 3.0])
    assert [f.scores["naive"].mase for f in folds] == pytest.approx([1.0, 3.0])
    summary = summarise(folds, "rmse")
    assert summary.mean["naive"] == pytest.approx(2.0)
    assert summary.sd["naive"] == pytest.approx(math.sqrt(2.0))  # ddof = 1
    assert [f.train_range for f in folds] == [(1.0, 200.0), (1.0, 300.0)]
    assert folds[1].test_range == (303.0, 600.0)


def test_linear_ar_beats_both_baselines_on_the_twin(seed0: Series) -> None:
    methods = {**BASELINES, "linear_ar": lambda: LinearAR(window=64)}
    folds = walk_forward(seed0.value, [4000, 7000], methods, test_size=500)
    for fold in folds:
        assert fold.scores["linear_ar"].rmse < 0.6 * fold.scores["naive"].rmse
        assert fold.scores["linear_ar"].mase < 1.0 < fold.scores["seasonal_naive"].mase
    # the drift: the last fold's test values sit above everything the first fold trained on
    assert folds[1].test_range[0] > folds[0].train_range[0]
    assert folds[1].test_range[1] > folds[0].train_range[1]


def test_a_recursive_method_runs_the_one_step_model_on_its_own_outputs(seed0: Series) -> None:
    x = seed0.value[:2000]
    methods: dict[str, MethodFactory] = {
        "linear_recursive": lambda: RecursiveForecaster(LinearAR(window=64), horizon=10),
        "linear_direct": lambda: LinearAR(window=64, horizon=10),
    }
    fold = evaluate_origin(x, 1500, methods, test_size=200, horizon=10)
    recursive = fold.models["linear_recursive"]
    assert isinstance(recursive, RecursiveForecaster)
    windows = np.lib.stride_tricks.sliding_window_view(x, 64)[fold.targets - 64][:, :, None]
    np.testing.assert_allclose(
        fold.forecasts["linear_recursive"], recursive_forecast(recursive.one_step, windows, 10)
    )
    steps = fold.rmse_per_step("linear_recursive")
    assert steps.shape == (10,) and steps[0] < steps[-1]  # errors compound with the horizon


@pytest.mark.parametrize(
    ("origins", "kwargs", "message"),
    [
        ([500, 400], {}, "must increase"),
        ([100, 400], {}, "too little training data"),
        ([400, 950], {}, "runs past the end"),
        ([400], {"test_size": 5, "horizon": 20}, "at least the horizon"),
        ([400], {"train_size": 80}, "training size"),
        ([], {}, "no origins"),
    ],
)
def test_unusable_origins_are_refused_before_any_fit(
    origins: list[int], kwargs: dict[str, int], message: str
) -> None:
    options = {"test_size": 100, "window": 64, **kwargs}
    with pytest.raises(DataError, match=message):
        check_origins(np.zeros(1000), origins, **options)


def test_nan_is_refused_only_where_the_evaluation_reads() -> None:
    x = np.sin(np.arange(1000) / 4.0)
    x[850] = np.nan
    check_origins(x, [400, 700], test_size=100, window=64)  # reads samples 0..799
    with pytest.raises(DataError, match="sample 850"):
        check_origins(x, [400, 800], test_size=100, window=64)
    with pytest.raises(DataError, match="sample 850"):
        walk_forward(x, [400, 800], BASELINES, test_size=100)
