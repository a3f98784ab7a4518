"""Training data and the honest split for every forecaster; no torch here (the
networks' training loops are in `networks`, which only fitting imports).

The split lives here so every forecaster (and the manifest's metrics) carves the same
validation block: the LAST `validation` forecast origins whose targets all lie before
`train_end`; training windows end far enough before it that no training target is within `h`
samples of a validation target. Epochs are picked on that block only, never on test data.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from app.errors import AppError, DataError
from app.forecasting import scores
from app.forecasting.base import Forecaster, as_2d
from app.forecasting.baselines import Naive
from app.forecasting.windows import sliding_windows, target_matrix

TEST_SAMPLES = 1000

EpochCallback = Callable[[dict[str, float]], None]


@dataclass(frozen=True)
class TrainingConfig:
    """The default training recipe: AdamW (lr 3e-3, weight decay 1e-2), gradient-norm clip 1.0,
    batch 128, 10 epochs. `validation` is the number of forecast origins carved from the end of
    the training period for epoch selection; `patience` stops after that many epochs without a
    better validation loss (None: run all epochs, still keep the best one); `refit` retrains
    on the whole training period for the chosen number of epochs."""

    epochs: int = 10
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 1e-2
    clip_norm: float = 1.0
    seed: int = 0
    validation: int = 500
    patience: int | None = None
    refit: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise AppError(f"epochs must be at least 1, got {self.epochs}")
        if self.batch_size < 1:
            raise AppError(f"batch size must be at least 1, got {self.batch_size}")
        if not (self.lr > 0 and self.clip_norm > 0 and self.weight_decay >= 0):
            raise AppError("lr and clip_norm must be positive, weight_decay non-negative")
        if self.validation < 0:
            raise AppError(f"validation must be non-negative, got {self.validation}")
        if self.patience is not None and self.patience < 1:
            raise AppError(f"patience must be at least 1, got {self.patience}")
        if self.refit and self.validation == 0:
            raise AppError("refit needs a validation block to choose the number of epochs")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Split:
    """Forecast origins (index of the first target of each window) for training and
    validation; both are target indices usable with `sliding_windows`/`target_matrix`."""

    train: np.ndarray
    validation: np.ndarray


def split_targets(train_end: int, *, window: int, horizon: int, validation: int) -> Split:
    """Carve the validation block from the end of the training period.

    Validation origins i satisfy i + h - 1 < train_end (the block never reaches train_end).
    When h > 1 the last training target sits more than h samples before the first validation
    target, so the overlapping multi-step targets of the two sets never share a sample.
    """
    stop = train_end - horizon + 1  # one past the last origin whose targets fit before train_end
    gap = horizon if horizon > 1 else 0
    val_start = stop - validation
    train_stop = val_start - (horizon - 1) - gap if validation else stop
    if train_stop <= window:
        needed = window + validation + (horizon - 1) + (horizon - 1 + gap if validation else 0) + 1
        raise DataError(
            f"train-end {train_end} is too small for a window of {window}"
            + (f", a validation block of {validation}" if validation else "")
            + f" and horizon {horizon}: it must be at least {needed}"
        )
    return Split(
        train=np.arange(window, train_stop),
        validation=np.arange(val_start, stop) if validation else np.arange(0),
    )


def training_part(
    series: np.ndarray, train_end: int | None, *, n_channels: int
) -> tuple[np.ndarray, int]:
    """(T, C) float64 data and a checked train_end; refuses NaN in what training reads."""
    data = as_2d(series)
    if data.shape[1] != n_channels:
        raise DataError(f"the model reads {n_channels} channel(s), the data has {data.shape[1]}")
    length = data.shape[0]
    end = length if train_end is None else int(train_end)
    if not 0 < end <= length:
        raise DataError(f"train-end {end} is outside the data (1..{length} samples)")
    bad = np.argwhere(~np.isfinite(data[:end]))
    if bad.size:
        row, channel = (int(v) for v in bad[0])
        raise DataError(
            f"the training part (samples 0..{end - 1}) has {bad.shape[0]} missing or non-finite "
            f"reading(s), the first at sample {row}, channel {channel}; "
            "fill them or choose another training period"
        )
    return data, end


@functools.cache
def _thread_pools() -> ThreadpoolController:
    """Inspecting the loaded libraries is slow next to a forecast; do it once."""
    return ThreadpoolController()


_ONE_THREAD_FOR_GOOD = False


def use_one_thread() -> None:
    """Put BLAS on one thread for the rest of the process (the service, at start-up), so
    `single_threaded` costs nothing there."""
    global _ONE_THREAD_FOR_GOOD
    _thread_pools().limit(limits=1, user_api="blas")
    _ONE_THREAD_FOR_GOOD = True


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run BLAS on one thread. Fits this small gain nothing from a second thread, and on a
    machine busy with other work a second one mostly waits for its share of a core."""
    if _ONE_THREAD_FOR_GOOD:
        yield
        return
    with _thread_pools().limit(limits=1, user_api="blas"):
        yield


def epoch_record(epoch: int, train_loss: float, norms: list[float]) -> dict[str, float]:
    """One epoch of `history_`; `val_loss` is filled in when there is a validation block."""
    return {
        "epoch": float(epoch),
        "train_loss": train_loss,
        "val_loss": math.nan,
        "grad_norm_mean": float(np.mean(norms)),
        "grad_norm_max": float(np.max(norms)),
    }


def best_epoch(history: list[dict[str, float]]) -> int:
    """1-based epoch with the lowest validation loss (the last one without validation)."""
    losses = [h["val_loss"] for h in history]
    if all(math.isnan(v) for v in losses):
        return len(history)
    return int(np.nanargmin(losses)) + 1


def holdout_metrics(
    forecaster: Forecaster,
    series: np.ndarray,
    train_end: int,
    *,
    validation: int,
) -> dict[str, Any]:
    """What a manifest records about a fitted forecaster's accuracy, in reading units.

    A trained network brings its best-epoch `validation_rmse_`; any other forecaster is
    refitted (a copy) on the part before the validation block and scored on it.
    When the data go beyond train_end, the next up-to-1000 origins are scored beside naive.
    """
    data = as_2d(series)
    window, horizon = forecaster.window, forecaster.horizon
    split = split_targets(train_end, window=window, horizon=horizon, validation=validation)
    metrics: dict[str, Any] = {}
    validation_rmse = getattr(forecaster, "validation_rmse_", None)
    if validation_rmse is not None:
        metrics["validation_rmse"] = float(validation_rmse)
    elif split.validation.size:
        # The probe trains on exactly the windows a network would train on before the block.
        probe = copy.deepcopy(forecaster).fit(data, train_end=int(split.train[-1]) + horizon)
        actual = target_matrix(data[:, 0], split.validation, horizon)
        forecast = probe.predict(sliding_windows(data, split.validation, window))
        metrics["validation_rmse"] = scores.rmse(forecast, actual)
    metrics["validation_samples"] = int(split.validation.size)
    stop = min(train_end + TEST_SAMPLES, data.shape[0] - horizon + 1)
    targets = np.arange(train_end, stop)
    if targets.size:
        windows = sliding_windows(data, targets, window)
        actual = target_matrix(data[:, 0], targets, horizon)
        usable = np.isfinite(windows).all(axis=(1, 2)) & np.isfinite(actual).all(axis=1)
        windows, actual = windows[usable], actual[usable]
        if actual.shape[0]:
            forecast = forecaster.predict(windows)
            naive = Naive(window=window, horizon=horizon, n_channels=data.shape[1]).predict(windows)
            test: dict[str, Any] = {
                "start": train_end,
                "samples": int(actual.shape[0]),
                "rmse": scores.rmse(forecast, actual),
                "naive_rmse": scores.rmse(naive, actual),
                "mean_error": scores.mean_error(forecast, actual),
            }
            if horizon > 1:
                test["rmse_by_step"] = scores.rmse_per_step(forecast, actual).tolist()
                test["naive_rmse_by_step"] = scores.rmse_per_step(naive, actual).tolist()
            metrics["test"] = test
    return metrics


def value_range(values: np.ndarray) -> tuple[float, float] | None:
    """(min, max) of the finite values, None when there are none."""
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if finite.size else None
