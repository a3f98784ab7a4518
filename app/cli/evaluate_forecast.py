"""`twinwatch evaluate forecast`: honest walk-forward evaluation of the forecasters."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from app.errors import DataError
from app.figures import require_matplotlib
from app.forecasting.stateful_lstm import STATEFUL_TRAINING
from app.forecasting.training import TrainingConfig
from app.forecasting.walkforward import (
    Evaluation,
    EvaluationConfig,
    check_evaluation,
    evaluate_forecasters,
)
from app.series import VALUE_COLUMN, read_csv

DEFAULT_ORIGINS = "4000,5000,6000,7000"
DEFAULT_FOCUS = 6000
QUICK_EPOCHS = 1
QUICK_TEST_SIZE = 200
QUICK_TRAIN_SIZE = 1000
QUICK_VALIDATION = 100


def parse_origins(text: str) -> tuple[int, ...]:
    """'4000,5000' -> (4000, 5000); anything else is a one-line error."""
    parts = [part.strip() for part in text.split(",")]
    try:
        origins = tuple(int(part) for part in parts)
    except ValueError:
        raise DataError(
            f"--origins must be comma-separated integers such as {DEFAULT_ORIGINS}, got {text!r}"
        ) from None
    return origins


def build_config(
    *,
    origins: tuple[int, ...],
    quick: bool,
    test_size: int | None,
    epochs: int | None,
    seed: int,
    focus_origin: int | None,
    horizon: int,
) -> EvaluationConfig:
    """Resolve the options; `--quick` shrinks what was not given explicitly."""
    if focus_origin is None:
        focus_origin = DEFAULT_FOCUS if DEFAULT_FOCUS in origins else origins[-1]
    if test_size is not None and test_size < 1:
        raise DataError(f"--test-size must be at least 1, got {test_size}")
    if epochs is not None and epochs < 1:
        raise DataError(f"--epochs must be at least 1, got {epochs}")
    recipe = TrainingConfig()
    training = TrainingConfig(
        epochs=epochs or (QUICK_EPOCHS if quick else recipe.epochs),
        seed=seed,
        validation=QUICK_VALIDATION if quick else recipe.validation,
    )
    stateful = dataclasses.replace(
        STATEFUL_TRAINING,
        epochs=epochs or (QUICK_EPOCHS if quick else STATEFUL_TRAINING.epochs),
        seed=seed,
        validation=training.validation,
    )
    return EvaluationConfig(
        origins=origins,
        test_size=test_size or (QUICK_TEST_SIZE if quick else EvaluationConfig.test_size),
        horizon=horizon,
        focus_origin=focus_origin,
        train_size=QUICK_TRAIN_SIZE if quick else None,
        training=training,
        stateful_training=stateful,
    )


def run_with_progress(series: np.ndarray, config: EvaluationConfig) -> Evaluation:
    """Run the evaluation under a transient progress bar on stderr, one tick per fit."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("fitting", total=config.n_fits)
        fitted = 0

        def on_fit(method: str, origin: int) -> None:
            nonlocal fitted
            progress.update(task, completed=fitted, description=f"origin {origin}: {method}")
            fitted += 1

        return evaluate_forecasters(series, config, on_fit=on_fit)


def evaluate_forecast_command(
    data: Annotated[
        Path,
        typer.Option("--data", help="CSV t,value[,...]: one row per sample; value is forecast."),
    ],
    origins: Annotated[
        str,
        typer.Option(
            help="Comma-separated walk-forward origins (sample indices): at each, the methods "
            "fit on the samples before it and forecast the test block after it."
        ),
    ] = DEFAULT_ORIGINS,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the JSON report to this file.")
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(help="Write PNG figures (forecasts, error by horizon) to this directory."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            help=f"Tiny run for smoke tests: {QUICK_EPOCHS} epoch, test blocks of "
            f"{QUICK_TEST_SIZE}, fits on the last {QUICK_TRAIN_SIZE} samples."
        ),
    ] = False,
    test_size: Annotated[
        int | None,
        typer.Option(help=f"Samples in each test block (default {EvaluationConfig.test_size})."),
    ] = None,
    epochs: Annotated[
        int | None,
        typer.Option(
            help=f"LSTM training epochs (default {TrainingConfig.epochs}; the stateful LSTM "
            f"{STATEFUL_TRAINING.epochs}, stopping after {STATEFUL_TRAINING.patience} epochs "
            "without a better validation loss)."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the LSTMs' weights, dropout and shuffling.")
    ] = 0,
    focus_origin: Annotated[
        int | None,
        typer.Option(
            help="Origin of the scaling and multi-step comparisons "
            f"(default {DEFAULT_FOCUS} if among the origins, else the last)."
        ),
    ] = None,
    horizon: Annotated[
        int,
        typer.Option(
            help=f"Samples ahead in the multi-step comparison (2 to {EvaluationConfig.period})."
        ),
    ] = EvaluationConfig.horizon,
) -> None:
    """Walk-forward forecast errors of every forecaster beside the baselines.

    At each origin every method is fitted afresh on the samples before it and scored on the
    test block after it: RMSE, MAE and MASE of naive, seasonal naive (the value one forcing
    period earlier), linear AR, LSTM and stateful LSTM, all on the same targets. At
    --focus-origin two comparisons follow: an LSTM on readings scaled by the training mean and
    std against the LSTM on each window's changes (the first fails once the level leaves the
    training range), and recursive against direct forecasts up to --horizon samples ahead.
    """
    if plots is not None:
        require_matplotlib()  # before the first (slow) fit
    from app.forecasting import report

    started = time.perf_counter()
    config = build_config(
        origins=parse_origins(origins),
        quick=quick,
        test_size=test_size,
        epochs=epochs,
        seed=seed,
        focus_origin=focus_origin,
        horizon=horizon,
    )
    series = read_csv(data).matrix([VALUE_COLUMN])
    check_evaluation(series, config)  # every refusal before the first (slow) fit
    evaluation = run_with_progress(series, config)
    seconds = time.perf_counter() - started

    console = Console()
    for metric in ("rmse", "mae", "mase"):
        console.print(report.metric_table(evaluation.folds, metric))
    console.print(report.range_table(evaluation.folds))
    failure = None
    if evaluation.global_fold is not None and config.focus_origin is not None:
        failure = report.global_failure(
            evaluation.fold_at(config.focus_origin), evaluation.global_fold
        )
        console.print(report.global_table(failure))
        console.print(failure.sentence(), highlight=False)
    if evaluation.multistep is not None:
        console.print(report.multistep_table(evaluation.multistep))
    console.print(f"evaluation took {seconds:.1f} s", highlight=False)

    if json_path is not None:
        body = report.build_report(
            evaluation.folds,
            failure=failure,
            multistep=evaluation.multistep,
            config={**config.to_dict(), "data": str(data), "quick": quick},
            seconds=seconds,
        )
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(body, indent=2) + "\n")
        console.print(f"wrote {json_path}", highlight=False)
    if plots is not None and config.focus_origin is not None:
        written = [
            report.plot_forecasts(
                evaluation.fold_at(config.focus_origin),
                plots / "forecasts.png",
                extra=evaluation.global_fold,
            )
        ]
        if evaluation.multistep is not None:
            written.append(report.plot_horizon(evaluation.multistep, plots / "horizon.png"))
        console.print(f"wrote {', '.join(map(str, written))}", highlight=False)
