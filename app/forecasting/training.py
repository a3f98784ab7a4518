"""Training data, the honest split, and the training loop for neural forecasters (SPEC 2-3).

The split lives here so every forecaster (and the manifest's metrics) carves the same
validation block: the LAST `validation` forecast origins whose targets all lie before
`train_end`; training windows end far enough before it that no training target is within `h`
samples of a validation target. Epochs are picked on that block only, never on test data.
"""

from __future__ import annotations

import copy
import functools
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from threadpoolctl import ThreadpoolController
from torch import nn
from tqdm import tqdm

from app.errors import AppError, DataError
from app.forecasting import scores
from app.forecasting.base import Forecaster, as_2d
from app.forecasting.baselines import Naive
from app.forecasting.windows import sliding_windows, target_matrix

PREDICT_CHUNK = 4096
TEST_SAMPLES = 1000

EpochCallback = Callable[[dict[str, float]], None]


@dataclass(frozen=True)
class TrainingConfig:
    """The SPEC's recipe. `validation` is the number of forecast origins carved from the end of
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
    """Inspecting the loaded libraries costs 0.5 ms; do it once, not per forecast."""
    return ThreadpoolController()


_ONE_THREAD_FOR_GOOD = False
_THIS_THREAD = threading.local()


def use_one_thread() -> None:
    """Put torch and BLAS on one thread for the rest of the process (the service, at start-up):
    `single_threaded` then costs nothing, where limiting the pools per call took ~90 us, more
    than a stateful LSTM step."""
    global _ONE_THREAD_FOR_GOOD
    torch.set_num_threads(1)
    _thread_pools().limit(limits=1, user_api="blas")
    _ONE_THREAD_FOR_GOOD = True


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch and BLAS on one thread. Models this small gain nothing from a second
    thread, and with two on a busy 2-core machine LSTM training ran 10x, a one-window
    forecast 400x and a linear AR fit 70x slower (measured). A long-running process should
    call `use_one_thread` at start-up; then this is a no-op."""
    if _ONE_THREAD_FOR_GOOD:
        if not getattr(_THIS_THREAD, "one_thread", False):
            # OpenMP keeps the thread count per calling thread: a thread that never set it
            # (each of the server's worker threads) runs torch's kernels with a team of the
            # default size, whose second thread then spins beside every forecast. Measured in
            # the service: a second core busy, ingest CPU per request doubled.
            torch.set_num_threads(1)
            _THIS_THREAD.one_thread = True
        yield
        return
    previous = torch.get_num_threads()
    with _thread_pools().limit(limits=1, user_api="blas"):
        if previous == 1:
            yield
            return
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(previous)


def forward_in_chunks(
    module: nn.Module, inputs: np.ndarray, chunk: int = PREDICT_CHUNK
) -> np.ndarray:
    """Run the network in eval mode without autograd, a bounded batch at a time."""
    module.eval()
    outputs = []
    with single_threaded(), torch.inference_mode():
        for start in range(0, inputs.shape[0], chunk):
            batch = torch.from_numpy(np.ascontiguousarray(inputs[start : start + chunk]))
            outputs.append(module(batch).numpy())
    return np.concatenate(outputs, axis=0)


def parameter_count(build: Callable[[], nn.Module]) -> int:
    """Parameters of the network `build` makes, built on the meta device: shapes only, no
    memory, no draw from the global random generator."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters())


def clipped_step(
    module: nn.Module, optimiser: torch.optim.Optimizer, loss: torch.Tensor, clip_norm: float
) -> float:
    """Back-propagate, clip the global gradient norm, step; the PRE-clip norm, for the log."""
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    norm = nn.utils.clip_grad_norm_(module.parameters(), clip_norm)
    optimiser.step()
    return float(norm)


def epoch_record(epoch: int, train_loss: float, norms: list[float]) -> dict[str, float]:
    """One epoch of `history_`; `val_loss` is filled in when there is a validation block."""
    return {
        "epoch": float(epoch),
        "train_loss": train_loss,
        "val_loss": math.nan,
        "grad_norm_mean": float(np.mean(norms)),
        "grad_norm_max": float(np.max(norms)),
    }


def train_network(
    module: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray] | None,
    config: TrainingConfig,
    *,
    epochs: int | None = None,
    progress: bool = False,
    on_epoch: EpochCallback | None = None,
) -> list[dict[str, float]]:
    """Minimise the MSE on float32 (inputs, targets) with AdamW and global-norm clipping.

    Returns one dict per epoch: train_loss, val_loss (NaN without validation),
    grad_norm_mean and grad_norm_max (the norm BEFORE clipping: how hard the clip worked).
    With validation, the module ends holding the weights of its best validation epoch.
    """
    n_epochs = config.epochs if epochs is None else epochs
    x_train, y_train = (torch.from_numpy(a) for a in train)
    rng = np.random.default_rng(config.seed)
    optimiser = torch.optim.AdamW(
        module.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    loss_fn = nn.MSELoss()
    n = x_train.shape[0]
    batches = math.ceil(n / config.batch_size)
    history: list[dict[str, float]] = []
    best_loss, best_state, since_best = math.inf, None, 0
    bar = tqdm(total=n_epochs * batches, disable=not progress, unit="batch", desc="training")
    with single_threaded(), bar:
        for epoch in range(1, n_epochs + 1):
            module.train()
            order = torch.from_numpy(rng.permutation(n))
            total, norms = 0.0, []
            for start in range(0, n, config.batch_size):
                index = order[start : start + config.batch_size]
                optimiser.zero_grad(set_to_none=True)
                loss = loss_fn(module(x_train[index]), y_train[index])
                norms.append(clipped_step(module, optimiser, loss, config.clip_norm))
                total += loss.item() * index.shape[0]
                bar.update(1)
            record = epoch_record(epoch, total / n, norms)
            if validation is not None:
                predicted = forward_in_chunks(module, validation[0]).astype(np.float64)
                record["val_loss"] = float(np.mean((predicted - validation[1]) ** 2))
                if record["val_loss"] < best_loss:
                    best_loss, since_best = record["val_loss"], 0
                    best_state = copy.deepcopy(module.state_dict())
                else:
                    since_best += 1
            history.append(record)
            bar.set_postfix(
                epoch=epoch, train=f"{record['train_loss']:.4f}", val=f"{record['val_loss']:.4f}"
            )
            if on_epoch is not None:
                on_epoch(record)
            if config.patience is not None and since_best >= config.patience:
                break
    if best_state is not None:
        module.load_state_dict(best_state)
    return history


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


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Fix torch's global generator (weight init, dropout) for the duration, then give the
    caller back the random state it had."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
