"""Walk-forward evaluation: refit at each origin, score on the block after it.

For each origin the forecasters are built afresh and fitted on a COPY of the samples before it,
so nothing at or after the origin can reach a fit, whatever the forecaster does; statistics
therefore come from the training part only. Every method of a fold is scored on the same
target indices, so errors are comparable to the baselines beside them. When h > 1 the fit
stops h samples before the origin, the gap `training.split_targets` also keeps between training
and validation: no training target lies within h samples of a test target.

Pure: no printing, no files. Progress is reported through an optional callback.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import numpy as np

from app.errors import DataError
from app.forecasting import scores
from app.forecasting.base import Forecaster, as_2d
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import GlobalLSTMForecaster, LSTMForecaster
from app.forecasting.multistep import recursive_forecast
from app.forecasting.stateful_lstm import (
    STATEFUL_TRAINING,
    STATEFUL_WINDOW,
    StatefulLSTMForecaster,
)
from app.forecasting.training import TrainingConfig
from app.forecasting.windows import sliding_windows, target_matrix

MethodFactory = Callable[[], Forecaster]
"""Builds a fresh, unfitted forecaster: each fold fits its own."""

FitCallback = Callable[[str, int], None]
"""Called with (method name, origin) just before each fit."""

Metric = Literal["rmse", "mae", "mase", "mean_error"]
METRICS: tuple[Metric, ...] = ("rmse", "mae", "mase", "mean_error")

MIN_TRAIN_TARGETS = 100
"""Fewest training windows a fold may have: below this no fit means anything."""


class RecursiveForecaster(Forecaster):
    """A one-step forecaster iterated on its own outputs, seen as a `horizon`-step forecaster so
    that recursive and direct methods run through the same fold and are scored alike."""

    kind = "recursive"

    def __init__(self, one_step: Forecaster, *, horizon: int) -> None:
        super().__init__(window=one_step.window, horizon=horizon, n_channels=one_step.n_channels)
        self.one_step = one_step

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        self.one_step.fit(series, train_end=train_end)
        return self

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        return recursive_forecast(self.one_step, windows, self.horizon)


@dataclass(frozen=True)
class Score:
    """Errors of one method on one fold, in the units of the series (MASE is unitless)."""

    rmse: float
    mae: float
    mase: float
    mean_error: float

    def get(self, metric: Metric) -> float:
        value: float = getattr(self, metric)
        return value


@dataclass(frozen=True)
class Fold:
    """One origin: what was fitted on what, and how each method scored on the block after it.

    `targets[b]` is the index of the first sample forecast by row b; `actual` and each entry of
    `forecasts` are (n, horizon). Ranges are of channel 0, in reading units.
    """

    origin: int
    horizon: int
    train_start: int
    train_end: int
    test_end: int
    targets: np.ndarray
    actual: np.ndarray
    forecasts: Mapping[str, np.ndarray]
    scores: Mapping[str, Score]
    fit_seconds: Mapping[str, float]
    models: Mapping[str, Forecaster]
    train_range: tuple[float, float]
    test_range: tuple[float, float]
    train_mean: float
    train_std: float

    def rmse_per_step(self, method: str) -> np.ndarray:
        """(horizon,) RMSE of `method` at each step ahead."""
        return scores.rmse_per_step(self.forecasts[method], self.actual)


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (ddof = 1) of one metric over folds, per method."""

    metric: Metric
    mean: Mapping[str, float]
    sd: Mapping[str, float]


def training_end(origin: int, horizon: int) -> int:
    """One past the last sample a fit may read for a test block starting at `origin`."""
    return origin - horizon if horizon > 1 else origin


def check_origins(
    series: np.ndarray,
    origins: Sequence[int],
    *,
    test_size: int,
    window: int,
    horizon: int = 1,
    train_size: int | None = None,
) -> None:
    """Refuse, before any fitting, origins the evaluation cannot honour, and NaN where it reads.

    Origins must increase, leave room for a window plus `MIN_TRAIN_TARGETS` training targets
    before them (and the h-sample gap), and have a whole test block after them.
    """
    data = as_2d(series)
    length = data.shape[0]
    if test_size < horizon:
        raise DataError(f"the test size ({test_size}) must be at least the horizon ({horizon})")
    if train_size is not None and train_size < window + MIN_TRAIN_TARGETS:
        raise DataError(
            f"the training size ({train_size}) must be at least the window ({window}) "
            f"plus {MIN_TRAIN_TARGETS} training targets"
        )
    if not origins:
        raise DataError("no origins given")
    if any(b <= a for a, b in itertools.pairwise(origins)):
        raise DataError(f"origins must increase strictly, got {', '.join(map(str, origins))}")
    smallest = window + MIN_TRAIN_TARGETS + (horizon if horizon > 1 else 0) + horizon - 1
    if origins[0] < smallest:
        raise DataError(
            f"origin {origins[0]} leaves too little training data: a window of {window}, "
            f"{MIN_TRAIN_TARGETS} training targets and horizon {horizon} need an origin "
            f">= {smallest}"
        )
    last = origins[-1]
    if last + test_size > length:
        raise DataError(
            f"origin {last} plus a test block of {test_size} runs past the end of the data "
            f"({length} samples); use origins <= {length - test_size} or a smaller test size"
        )
    first_read = 0
    if train_size is not None:
        first_read = max(0, training_end(origins[0], horizon) - train_size)
    used = data[first_read : last + test_size]
    bad = np.argwhere(~np.isfinite(used))
    if bad.size:
        row, channel = (int(v) for v in bad[0])
        raise DataError(
            f"sample {first_read + row} (channel {channel}) is missing or not finite, and the "
            f"evaluation reads samples {first_read}..{last + test_size - 1}"
        )


def evaluate_origin(
    series: np.ndarray,
    origin: int,
    methods: Mapping[str, MethodFactory],
    *,
    test_size: int,
    horizon: int = 1,
    train_size: int | None = None,
    on_fit: FitCallback | None = None,
) -> Fold:
    """Fit every method on the samples before `origin`, score all on the same test targets.

    The test targets are the indices i in [origin, origin + test_size) whose `horizon` samples
    i..i+h-1 all lie inside the block. `train_size` (None: everything before) limits the fit
    to the last that many samples, a sliding rather than expanding window.
    """
    data = as_2d(series)
    test_end = origin + test_size
    train_end = training_end(origin, horizon)
    train_start = 0 if train_size is None else max(0, train_end - train_size)
    if not 0 < train_end <= origin < test_end <= data.shape[0]:
        raise DataError(
            f"origin {origin} with a test block of {test_size} does not fit in "
            f"{data.shape[0]} samples"
        )
    targets = np.arange(origin, test_end - horizon + 1)
    actual = target_matrix(data[:, 0], targets, horizon)
    train_values = data[train_start:train_end, 0]
    forecasts: dict[str, np.ndarray] = {}
    fold_scores: dict[str, Score] = {}
    fit_seconds: dict[str, float] = {}
    models: dict[str, Forecaster] = {}
    for name, factory in methods.items():
        model = factory()
        if model.horizon != horizon:
            raise ValueError(f"method {name} forecasts {model.horizon} steps, the fold {horizon}")
        if on_fit is not None:
            on_fit(name, origin)
        started = time.perf_counter()
        # A copy: the fit cannot see, or alter, anything at or after train_end.
        model.fit(data[train_start:train_end].copy())
        fit_seconds[name] = time.perf_counter() - started
        forecast = model.predict(sliding_windows(data, targets, model.window))
        models[name] = model
        forecasts[name] = forecast
        fold_scores[name] = Score(
            rmse=scores.rmse(forecast, actual),
            mae=scores.mae(forecast, actual),
            mase=scores.mase(forecast, actual, train_values=train_values),
            mean_error=scores.mean_error(forecast, actual),
        )
    test_values = data[origin:test_end, 0]
    return Fold(
        origin=origin,
        horizon=horizon,
        train_start=train_start,
        train_end=train_end,
        test_end=test_end,
        targets=targets,
        actual=actual,
        forecasts=forecasts,
        scores=fold_scores,
        fit_seconds=fit_seconds,
        models=models,
        train_range=(float(train_values.min()), float(train_values.max())),
        test_range=(float(test_values.min()), float(test_values.max())),
        train_mean=float(train_values.mean()),
        train_std=float(train_values.std()),
    )


def walk_forward(
    series: np.ndarray,
    origins: Sequence[int],
    methods: Mapping[str, MethodFactory],
    *,
    test_size: int,
    horizon: int = 1,
    train_size: int | None = None,
    on_fit: FitCallback | None = None,
) -> list[Fold]:
    """One `Fold` per origin, each refitted on the samples before its origin."""
    window = max((factory().window for factory in methods.values()), default=1)
    check_origins(
        series, origins, test_size=test_size, window=window, horizon=horizon, train_size=train_size
    )
    return [
        evaluate_origin(
            series,
            origin,
            methods,
            test_size=test_size,
            horizon=horizon,
            train_size=train_size,
            on_fit=on_fit,
        )
        for origin in origins
    ]


def summarise(folds: Sequence[Fold], metric: Metric) -> Summary:
    """Mean and spread over folds of `metric` for each method present in every fold."""
    if not folds:
        raise ValueError("no folds to summarise")
    names = [name for name in folds[0].scores if all(name in f.scores for f in folds)]
    values = {name: np.array([f.scores[name].get(metric) for f in folds]) for name in names}
    return Summary(
        metric=metric,
        mean={name: float(v.mean()) for name, v in values.items()},
        sd={name: float(v.std(ddof=1)) if v.size > 1 else 0.0 for name, v in values.items()},
    )


# ---- the standard comparison: forecasters, baselines, multi-step ------------------------------


@dataclass(frozen=True)
class EvaluationConfig:
    """What `twinwatch evaluate forecast` runs. `focus_origin` (one of the origins, or None to
    skip) is where the global-z-score failure and the multi-step comparison are measured."""

    origins: tuple[int, ...] = (4000, 5000, 6000, 7000)
    test_size: int = 1000
    window: int = 64
    period: int = 50
    horizon: int = 20
    focus_origin: int | None = 6000
    train_size: int | None = None
    training: TrainingConfig = field(default_factory=TrainingConfig)
    stateful_training: TrainingConfig = STATEFUL_TRAINING

    def __post_init__(self) -> None:
        if self.focus_origin is not None and self.focus_origin not in self.origins:
            raise DataError(
                f"the focus origin {self.focus_origin} must be one of the origins "
                f"({', '.join(map(str, self.origins))})"
            )
        if self.horizon < 2 or self.horizon > self.period:
            raise DataError(
                f"the multi-step horizon must be 2..{self.period} (seasonal naive forecasts at "
                f"most one period ahead), got {self.horizon}"
            )

    @property
    def n_fits(self) -> int:
        """Fits the whole evaluation makes: a progress bar's total."""
        per_fold = len(self.one_step_methods())
        focus = 1 + len(self.multistep_methods()) if self.focus_origin is not None else 0
        return per_fold * len(self.origins) + focus

    def _lstm(self, horizon: int, model: type[LSTMForecaster] = LSTMForecaster) -> LSTMForecaster:
        return model(window=self.window, horizon=horizon, training=self.training)

    def one_step_methods(self) -> dict[str, MethodFactory]:
        """The walk-forward table's methods, keyed as in the JSON report."""
        return {
            "naive": lambda: Naive(window=self.window),
            "seasonal_naive": lambda: SeasonalNaive(period=self.period, window=self.window),
            "linear_ar": lambda: LinearAR(window=self.window),
            "lstm": lambda: self._lstm(1),
            # A longer warm-up, so the fold scores what the live stream would forecast.
            "lstm_stateful": lambda: StatefulLSTMForecaster(
                window=max(self.window, STATEFUL_WINDOW), training=self.stateful_training
            ),
        }

    def global_methods(self) -> dict[str, MethodFactory]:
        return {"lstm_global": lambda: self._lstm(1, GlobalLSTMForecaster)}

    def multistep_methods(self) -> dict[str, MethodFactory]:
        """The six multi-step methods (naive, seasonal naive, linear and LSTM each recursive and
        direct), all forecasting `horizon`."""
        h = self.horizon
        return {
            "naive": lambda: Naive(window=self.window, horizon=h),
            "seasonal_naive": lambda: SeasonalNaive(
                period=self.period, window=self.window, horizon=h
            ),
            "linear_recursive": lambda: RecursiveForecaster(
                LinearAR(window=self.window), horizon=h
            ),
            "linear_direct": lambda: LinearAR(window=self.window, horizon=h),
            "lstm_recursive": lambda: RecursiveForecaster(self._lstm(1), horizon=h),
            "lstm_direct": lambda: self._lstm(h),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "origins": list(self.origins),
            "test_size": self.test_size,
            "window": self.window,
            "seasonal_period": self.period,
            "multistep_horizon": self.horizon,
            "focus_origin": self.focus_origin,
            "train_size": self.train_size,
            "training": self.training.to_dict(),
            "stateful_training": self.stateful_training.to_dict(),
            "sd": "sample standard deviation over folds (ddof = 1)",
            "mean_error": "mean(forecast - actual)",
        }


@dataclass(frozen=True)
class Evaluation:
    """The walk-forward folds; at the focus origin, the global model's fold (same targets as
    that walk-forward fold) and the multi-step fold (None when there is no focus origin)."""

    config: EvaluationConfig
    folds: list[Fold]
    global_fold: Fold | None
    multistep: Fold | None

    def fold_at(self, origin: int) -> Fold:
        return next(fold for fold in self.folds if fold.origin == origin)


def check_evaluation(series: np.ndarray, config: EvaluationConfig) -> None:
    """Every refusal `evaluate_forecasters` could make, made before the first fit."""
    check_origins(
        series,
        config.origins,
        test_size=config.test_size,
        window=config.window,
        train_size=config.train_size,
    )
    if config.focus_origin is not None:
        check_origins(
            series,
            [config.focus_origin],
            test_size=config.test_size,
            window=config.window,
            horizon=config.horizon,
            train_size=config.train_size,
        )


def evaluate_forecasters(
    series: np.ndarray, config: EvaluationConfig, *, on_fit: FitCallback | None = None
) -> Evaluation:
    """Walk-forward over the one-step methods, then the global failure and the multi-step
    comparison at the focus origin."""
    check_evaluation(series, config)
    test_size, train_size = config.test_size, config.train_size
    folds = walk_forward(
        series,
        config.origins,
        config.one_step_methods(),
        test_size=test_size,
        train_size=train_size,
        on_fit=on_fit,
    )
    global_fold = multistep = None
    if config.focus_origin is not None:
        global_fold = evaluate_origin(
            series,
            config.focus_origin,
            config.global_methods(),
            test_size=test_size,
            train_size=train_size,
            on_fit=on_fit,
        )
        multistep = evaluate_origin(
            series,
            config.focus_origin,
            config.multistep_methods(),
            test_size=test_size,
            horizon=config.horizon,
            train_size=train_size,
            on_fit=on_fit,
        )
    return Evaluation(config=config, folds=folds, global_fold=global_fold, multistep=multistep)
