"""`twinwatch train`: fit one forecaster on the start of a record and save its artifact."""

from __future__ import annotations

import dataclasses
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from app.errors import ArtifactError, DataError
from app.forecasting.artifacts import MANIFEST_FILE, save_model
from app.forecasting.base import Forecaster
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import GlobalLSTMForecaster, LSTMForecaster
from app.forecasting.normalisation import training_statistics
from app.forecasting.stateful_lstm import (
    STATEFUL_TRAINING,
    STATEFUL_WINDOW,
    StatefulLSTMForecaster,
)
from app.forecasting.training import (
    TEST_SAMPLES,
    TrainingConfig,
    holdout_metrics,
    training_part,
    value_range,
)
from app.series import VALUE_COLUMN, read_csv


class Kind(StrEnum):
    LSTM = "lstm"
    LSTM_GLOBAL = "lstm-global"
    LSTM_STATEFUL = "lstm-stateful"
    LINEAR_AR = "linear-ar"


def parse_channels(text: str) -> list[str]:
    """'value,reference' -> ['value', 'reference']; channel 0 is the one forecast."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise DataError(f"--channels {text!r} has an empty name; expected e.g. 'value,reference'")
    if len(set(names)) != len(names):
        raise DataError(f"--channels {text!r} names a channel twice")
    return names


def check_out(out: Path) -> None:
    """Refuse an --out that cannot hold a model before spending minutes on training."""
    if out.exists():
        if not out.is_dir():
            raise ArtifactError(f"--out {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
            raise ArtifactError(
                f"--out {out} is a non-empty directory that holds no model; "
                "choose a new directory (an existing model directory is overwritten)"
            )
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ArtifactError(f"--out {out}: cannot create it under {parent}")


def build(
    kind: Kind, *, window: int, horizon: int, n_channels: int, training: TrainingConfig
) -> Forecaster:
    if kind is Kind.LINEAR_AR:
        return LinearAR(window=window, horizon=horizon, n_channels=n_channels)
    if kind is Kind.LSTM_STATEFUL:
        return StatefulLSTMForecaster(
            window=window, horizon=horizon, n_channels=n_channels, training=training
        )
    model = GlobalLSTMForecaster if kind is Kind.LSTM_GLOBAL else LSTMForecaster
    return model(window=window, horizon=horizon, n_channels=n_channels, training=training)


def _span(values: tuple[float, float] | None, mean: float, std: float) -> str:
    if values is None:
        return "no finite readings"
    low, high = values
    return f"{low:.2f} .. {high:.2f} (z {(low - mean) / std:+.2f} .. {(high - mean) / std:+.2f})"


def input_ranges(
    target: np.ndarray, train_end: int, mean: float, std: float
) -> tuple[dict[str, Any], list[str]]:
    """The test inputs beside the training inputs, raw and in the training z-units a globally
    normalised model sees: whether a model must extrapolate. Returns (manifest entry, lines)."""
    train = value_range(target[:train_end])
    test_values = target[train_end : train_end + TEST_SAMPLES]
    test = value_range(test_values) if test_values.size else None
    lines = [f"training inputs 0..{train_end - 1}: {_span(train, mean, std)}"]
    if test_values.size:
        last = train_end + test_values.size - 1
        lines.append(f"test inputs {train_end}..{last}: {_span(test, mean, std)}")
        if train is not None and test is not None and (test[0] < train[0] or test[1] > train[1]):
            lines.append(
                "the test inputs leave the training range: a globally normalised model "
                "extrapolates there; the per-window LSTM and linear AR only see changes"
            )
    else:
        lines.append("test inputs: none (the data end at train-end)")
    entry = {"train": list(train) if train else None, "test": list(test) if test else None}
    return entry, lines


def _print_epoch(record: dict[str, float], epochs: int) -> None:
    from tqdm import tqdm  # the train extra's, like the training it reports on

    tqdm.write(
        f"epoch {int(record['epoch']):>2}/{epochs}  train loss {record['train_loss']:.5f}  "
        f"val loss {record['val_loss']:.5f}  grad norm before clip: "
        f"mean {record['grad_norm_mean']:.3f} max {record['grad_norm_max']:.3f}"
    )


def _print_metrics(metrics: dict[str, Any]) -> None:
    if "validation_rmse" in metrics:
        typer.echo(
            f"validation RMSE {metrics['validation_rmse']:.4f} "
            f"({metrics['validation_samples']} origins at the end of the training period)"
        )
    test = metrics.get("test")
    if test is not None:
        end = test["start"] + test["samples"] - 1
        typer.echo(
            f"test RMSE {test['rmse']:.4f} vs naive {test['naive_rmse']:.4f} on {test['samples']} "
            f"origins from {test['start']} (to {end}), mean error {test['mean_error']:+.4f}"
        )


def train_command(
    data: Annotated[
        Path,
        typer.Option(
            "--data", help="CSV t,value[,reference,...]: one row per sample, uniformly spaced."
        ),
    ],
    train_end: Annotated[
        int,
        typer.Option(
            "--train-end",
            help="Train on samples 0 .. TRAIN_END-1 only; the model sees no later one.",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Model directory to write (models/NAME to serve it).")
    ],
    kind: Annotated[Kind, typer.Option(help="Forecaster to train (listed above).")] = Kind.LSTM,
    horizon: Annotated[
        int, typer.Option(help="Samples ahead the model forecasts directly (1: the next one).")
    ] = 1,
    window: Annotated[
        int | None,
        typer.Option(
            help=f"Readings per input window (default 64; lstm-stateful {STATEFUL_WINDOW}, "
            "the readings it steps through before its first forecast)."
        ),
    ] = None,
    channels: Annotated[
        str,
        typer.Option(help="Comma-separated CSV columns the model reads; the first is forecast."),
    ] = VALUE_COLUMN,
    epochs: Annotated[
        int | None,
        typer.Option(
            help=f"Training epochs (default {TrainingConfig.epochs}; lstm-stateful "
            f"{STATEFUL_TRAINING.epochs}, stopping after {STATEFUL_TRAINING.patience} epochs "
            "without a better validation loss)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of weights, dropout and shuffling.")] = 0,
    validation_samples: Annotated[
        int,
        typer.Option(
            help="Forecast origins at the end of the training period kept out of the fit to "
            "pick the best epoch."
        ),
    ] = TrainingConfig.validation,
) -> None:
    """Train a forecaster on the start of a record and save it as a model directory.

    Forecasters (--kind):
    lstm: an LSTM on each window's changes from its last reading;
    lstm-global: an LSTM on readings scaled by the training mean and std (it fails once the level
    leaves the training range);
    lstm-stateful: an LSTM carried one step per reading, like the twin's shipped model
    (lstm-stateful-day-seed3);
    linear-ar: a linear autoregression on the window.

    The best epoch is picked on the last --validation-samples forecast origins before
    --train-end; the samples after it (up to 1,000) give a test RMSE beside the naive forecast's.
    Thresholds come afterwards, from twinwatch calibrate.
    """
    if horizon < 1:
        raise DataError(f"--horizon must be at least 1, got {horizon}")
    if window is None:
        window = STATEFUL_WINDOW if kind is Kind.LSTM_STATEFUL else 64
    if window < 2:
        raise DataError(f"--window must be at least 2, got {window}")
    check_out(out)
    names = parse_channels(channels)
    series = read_csv(data)
    matrix = series.matrix(names)
    if train_end > len(series):
        raise DataError(
            f"--train-end {train_end} is beyond the data: {data} has {len(series)} samples"
        )
    training_part(matrix, train_end, n_channels=len(names))
    recipe = STATEFUL_TRAINING if kind is Kind.LSTM_STATEFUL else TrainingConfig()
    config = dataclasses.replace(
        recipe,
        epochs=recipe.epochs if epochs is None else epochs,
        seed=seed,
        validation=validation_samples,
    )
    forecaster = build(kind, window=window, horizon=horizon, n_channels=len(names), training=config)
    mean, std = training_statistics(matrix[:train_end])
    ranges, lines = input_ranges(matrix[:, 0], train_end, float(mean[0]), float(std[0]))
    for line in lines:
        typer.echo(line)
    started = time.perf_counter()
    if isinstance(forecaster, LSTMForecaster | StatefulLSTMForecaster):
        typer.echo(
            f"training {forecaster.kind} ({forecaster.n_parameters} parameters) on samples "
            f"0..{train_end - 1}, channels {', '.join(names)}, horizon {horizon}"
        )
        forecaster.fit(
            matrix,
            train_end=train_end,
            progress=True,
            on_epoch=lambda record: _print_epoch(record, config.epochs),
        )
    else:
        forecaster.fit(matrix, train_end=train_end)
    seconds = time.perf_counter() - started
    metrics = holdout_metrics(forecaster, matrix, train_end, validation=validation_samples)
    _print_metrics(metrics)
    save_model(
        forecaster,
        out,
        extra={
            "channels": names,
            "training": {
                "data": str(data),
                "data_sha256": series.sha256(),
                "train_end": train_end,
                "samples": train_end,
                "mean": mean.tolist(),
                "std": std.tolist(),
                "input_range": ranges,
                "seconds": round(seconds, 2),
            },
            "metrics": metrics,
        },
    )
    typer.echo(f"trained in {seconds:.1f} s; saved {forecaster.kind} to {out}")
