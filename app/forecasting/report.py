"""What `twinwatch evaluate forecast` shows: rich tables, the JSON report and PNG figures.

Everything here reads finished `Fold`s; nothing fits or scores anew except through
`app.forecasting.scores`. Figures are drawn on the Agg canvas directly (no pyplot state), so
they render the same on a headless server; matplotlib (the `plots` extra) is imported only
when one is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from app.forecasting import scores
from app.forecasting.walkforward import Fold, Metric, summarise

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LABELS: dict[str, str] = {
    "naive": "naive",
    "seasonal_naive": "seasonal naive",
    "linear_ar": "linear AR",
    "lstm": "LSTM",
    "lstm_stateful": "stateful LSTM",
    "lstm_global": "LSTM, global z-score",
    "linear_recursive": "linear recursive",
    "linear_direct": "linear direct",
    "lstm_recursive": "LSTM recursive",
    "lstm_direct": "LSTM direct",
}
TABLE_HORIZONS = (1, 5, 10, 20)
PLOT_SAMPLES = 200


def label(method: str) -> str:
    return LABELS.get(method, method)


def _range(values: tuple[float, float]) -> str:
    return f"{values[0]:.2f}..{values[1]:.2f}"


@dataclass(frozen=True)
class GlobalFailure:
    """The globally z-scored LSTM beside the per-window (fixed) one and naive, on one fold's
    targets. Ranges are z-scored with the training statistics, as the global model sees them."""

    origin: int
    global_rmse: float
    global_mean_error: float
    fixed_rmse: float
    fixed_mean_error: float
    naive_rmse: float
    train_z_range: tuple[float, float]
    test_z_range: tuple[float, float]

    @property
    def ratio(self) -> float:
        """How many times worse the global model is than the per-window one."""
        return self.global_rmse / self.fixed_rmse

    def sentence(self) -> str:
        bias = "biased low" if self.global_mean_error < 0 else "not biased low"
        versus = "worse" if self.global_rmse > self.naive_rmse else "better"
        return (
            f"At origin {self.origin} the globally z-scored LSTM sees test inputs in "
            f"{_range(self.test_z_range)} (training {_range(self.train_z_range)}): RMSE "
            f"{self.global_rmse:.3f}, {self.ratio:.1f}x the per-window LSTM's "
            f"{self.fixed_rmse:.3f} and {versus} than naive ({self.naive_rmse:.3f}); "
            f"mean error (forecast - actual) {self.global_mean_error:+.3f}, {bias} "
            f"(per-window {self.fixed_mean_error:+.3f})."
        )


def global_failure(
    fold: Fold, global_fold: Fold, *, fixed: str = "lstm", failing: str = "lstm_global"
) -> GlobalFailure:
    """Compare `failing` (scored in `global_fold`) with `fixed` and naive (in `fold`)."""
    if not np.array_equal(fold.targets, global_fold.targets):
        raise ValueError("the global model must be scored on the fold's own targets")
    failed, kept = global_fold.scores[failing], fold.scores[fixed]

    def z(values: tuple[float, float]) -> tuple[float, float]:
        return (
            (values[0] - fold.train_mean) / fold.train_std,
            (values[1] - fold.train_mean) / fold.train_std,
        )

    return GlobalFailure(
        origin=fold.origin,
        global_rmse=failed.rmse,
        global_mean_error=failed.mean_error,
        fixed_rmse=kept.rmse,
        fixed_mean_error=kept.mean_error,
        naive_rmse=fold.scores["naive"].rmse,
        train_z_range=z(fold.train_range),
        test_z_range=z(fold.test_range),
    )


# ---- tables ---------------------------------------------------------------------------------


def metric_table(folds: Sequence[Fold], metric: Metric) -> Table:
    """One row per fold, one column per method, then the mean and sd over folds."""
    summary = summarise(folds, metric)
    methods = list(summary.mean)
    title = {"rmse": "RMSE", "mae": "MAE", "mase": "MASE", "mean_error": "mean error"}[metric]
    table = Table(title=f"Walk-forward {title} (same targets for every method)")
    table.add_column("origin", justify="right")
    table.add_column("targets", justify="right")
    for method in methods:
        table.add_column(label(method), justify="right")
    for fold in folds:
        best = min(methods, key=lambda m: fold.scores[m].get(metric))
        cells = [
            f"[bold]{fold.scores[m].get(metric):.3f}[/]"
            if m == best
            else f"{fold.scores[m].get(metric):.3f}"
            for m in methods
        ]
        table.add_row(str(fold.origin), str(fold.targets.size), *cells)
    table.add_section()
    table.add_row("mean", "", *(f"{summary.mean[m]:.3f}" for m in methods))
    table.add_row("sd", "", *(f"{summary.sd[m]:.3f}" for m in methods))
    return table


def range_table(folds: Sequence[Fold]) -> Table:
    """Training vs test input range: a test range outside the training one is extrapolation."""
    table = Table(title="Training vs test input range (channel 0, reading units)")
    for name in ("origin", "trained on", "train min..max", "test min..max", "test inside?"):
        table.add_column(name, justify="right")
    table.add_column("fit s", justify="right")
    for fold in folds:
        inside = fold.train_range[0] <= fold.test_range[0] and (
            fold.test_range[1] <= fold.train_range[1]
        )
        table.add_row(
            str(fold.origin),
            f"{fold.train_start}..{fold.train_end - 1}",
            _range(fold.train_range),
            _range(fold.test_range),
            "yes" if inside else "[yellow]no[/]",
            f"{sum(fold.fit_seconds.values()):.1f}",
        )
    return table


def global_table(failure: GlobalFailure) -> Table:
    table = Table(title=f"Global z-score failure at origin {failure.origin}")
    for name in ("model", "RMSE", "mean error", "x per-window RMSE"):
        table.add_column(name, justify="right")
    rows = [
        ("naive", failure.naive_rmse, None),
        ("LSTM, per-window", failure.fixed_rmse, failure.fixed_mean_error),
        ("LSTM, global z-score", failure.global_rmse, failure.global_mean_error),
    ]
    for name, value, bias in rows:
        table.add_row(
            name,
            f"{value:.3f}",
            "" if bias is None else f"{bias:+.3f}",
            f"{value / failure.fixed_rmse:.2f}",
        )
    return table


def multistep_table(fold: Fold, horizons: Sequence[int] = TABLE_HORIZONS) -> Table:
    """RMSE at selected steps ahead; the JSON report has every step."""
    shown = [h for h in horizons if h <= fold.horizon]
    table = Table(
        title=f"Multi-step RMSE from origin {fold.origin}",
        caption=f"{fold.targets.size} forecast origins, the same for every method",
    )
    table.add_column("method")
    for h in shown:
        table.add_column(f"h={h}", justify="right")
    per_step = {m: fold.rmse_per_step(m) for m in fold.forecasts}
    for method, values in per_step.items():
        cells = []
        for h in shown:
            best = min(per_step, key=lambda m: per_step[m][h - 1])
            text = f"{values[h - 1]:.3f}"
            cells.append(f"[bold]{text}[/]" if method == best else text)
        table.add_row(label(method), *cells)
    return table


# ---- JSON -----------------------------------------------------------------------------------


def _fold_json(fold: Fold) -> dict[str, Any]:
    methods = list(fold.scores)
    entry: dict[str, Any] = {"origin": fold.origin}
    for metric in ("rmse", "mae", "mase", "mean_error"):
        entry[metric] = {m: fold.scores[m].get(metric) for m in methods}
    entry.update(
        targets=int(fold.targets.size),
        train_samples=[fold.train_start, fold.train_end],
        test_samples=[fold.origin, fold.test_end],
        train_range=list(fold.train_range),
        test_range=list(fold.test_range),
        fit_seconds=dict(fold.fit_seconds),
    )
    return entry


def build_report(
    folds: Sequence[Fold],
    *,
    failure: GlobalFailure | None,
    multistep: Fold | None,
    config: Mapping[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """The JSON report: per-fold scores, mean and sd over folds, the global failure, and the
    multi-step comparison with every step."""
    report: dict[str, Any] = {"folds": [_fold_json(fold) for fold in folds]}
    for metric in ("rmse", "mae", "mase"):
        summary = summarise(folds, metric)
        report[f"mean_{metric}"] = dict(summary.mean)
        report[f"sd_{metric}"] = dict(summary.sd)
    if failure is not None:
        report["global_zscore_failure"] = {
            "origin": failure.origin,
            "lstm_rmse": failure.global_rmse,
            "naive_rmse": failure.naive_rmse,
            "mean_error": failure.global_mean_error,
            "fixed_lstm_rmse": failure.fixed_rmse,
            "fixed_mean_error": failure.fixed_mean_error,
            "ratio_to_fixed": failure.ratio,
            "train_range_z": list(failure.train_z_range),
            "test_range_z": list(failure.test_z_range),
        }
    if multistep is not None:
        report["multistep"] = {
            "origin": multistep.origin,
            "forecast_origins": int(multistep.targets.size),
            "train_samples": [multistep.train_start, multistep.train_end],
            "horizons": list(range(1, multistep.horizon + 1)),
            "rmse": {m: multistep.rmse_per_step(m).tolist() for m in multistep.forecasts},
            "fit_seconds": dict(multistep.fit_seconds),
        }
    report["config"] = dict(config)
    report["seconds"] = seconds
    return report


# ---- figures --------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(figure: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)
    return path


def plot_forecasts(
    fold: Fold, path: Path, *, extra: Fold | None = None, samples: int = PLOT_SAMPLES
) -> Path:
    """Forecast vs measured on the first `samples` one-step test targets of a fold."""
    n = min(samples, fold.targets.size)
    figure = _figure(11, 4.5)
    axes = figure.add_subplot()
    axes.plot(fold.targets[:n], fold.actual[:n, 0], color="black", lw=2.0, label="measured")
    forecasts = dict(fold.forecasts)
    if extra is not None:
        forecasts.update(extra.forecasts)
    for method, forecast in forecasts.items():
        rmse = scores.rmse(forecast[:n, 0], fold.actual[:n, 0])
        axes.plot(fold.targets[:n], forecast[:n, 0], lw=1.0, label=f"{label(method)} ({rmse:.3f})")
    axes.set(
        xlabel="sample",
        ylabel="reading",
        title=f"One-step forecasts after origin {fold.origin} (RMSE on these {n} samples)",
    )
    axes.legend(loc="upper left", fontsize="small", ncols=2)
    return _save(figure, path)


def plot_horizon(fold: Fold, path: Path) -> Path:
    """RMSE against the number of steps ahead for each multi-step method."""
    figure = _figure(8, 4.5)
    axes = figure.add_subplot()
    steps = np.arange(1, fold.horizon + 1)
    for method in fold.forecasts:
        style = "--" if "recursive" in method else "-"
        axes.plot(steps, fold.rmse_per_step(method), style, marker="o", ms=3, label=label(method))
    axes.set(
        xlabel="steps ahead h",
        ylabel="RMSE",
        title=f"Error against horizon from origin {fold.origin}",
        xticks=steps,
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _save(figure, path)
