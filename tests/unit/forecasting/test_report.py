from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from app.errors import DataError
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.report import (
    build_report,
    global_failure,
    metric_table,
    multistep_table,
    plot_forecasts,
    plot_horizon,
)
from app.forecasting.walkforward import EvaluationConfig, Fold, MethodFactory, evaluate_origin


def _render(table: object) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


@pytest.fixture(scope="module")
def ramp_folds() -> tuple[list[Fold], Fold]:
    """On a ramp of slope 2 naive is 2 low and seasonal naive (m = 50) 100 low: the failing
    model stands in for the global LSTM, naive for the fixed one."""
    x = 2.0 * np.arange(1000)
    fixed: dict[str, MethodFactory] = {"naive": lambda: Naive(window=64)}
    failing: dict[str, MethodFactory] = {"lstm_global": lambda: SeasonalNaive(window=64)}
    folds = [evaluate_origin(x, o, fixed, test_size=100) for o in (500, 700)]
    return folds, evaluate_origin(x, 700, failing, test_size=100)


def test_global_failure_reports_ratio_bias_and_z_scored_ranges(
    ramp_folds: tuple[list[Fold], Fold],
) -> None:
    folds, global_fold = ramp_folds
    failure = global_failure(folds[1], global_fold, fixed="naive")
    assert failure.global_rmse == pytest.approx(100.0)
    assert failure.ratio == pytest.approx(50.0)
    assert failure.global_mean_error == pytest.approx(-100.0)
    # training values 0, 2, ..., 1398: mean 699; the test block starts 1400, above them all
    std = float(np.std(2.0 * np.arange(700)))
    assert failure.train_z_range == pytest.approx((-699 / std, 699 / std))
    assert failure.test_z_range[0] == pytest.approx(701 / std)
    sentence = failure.sentence()
    assert "50.0x" in sentence and "biased low" in sentence and "-100.000" in sentence
    with pytest.raises(ValueError, match="own targets"):
        global_failure(folds[0], global_fold, fixed="naive")


def test_tables_and_report_carry_the_same_numbers(ramp_folds: tuple[list[Fold], Fold]) -> None:
    folds, global_fold = ramp_folds
    text = _render(metric_table(folds, "rmse"))
    assert "2.000" in text and "mean" in text and "sd" in text
    report = build_report(
        folds,
        failure=global_failure(folds[1], global_fold, fixed="naive"),
        multistep=None,
        config={"origins": [500, 700]},
        seconds=1.5,
    )
    assert report["mean_rmse"] == {"naive": pytest.approx(2.0)}
    assert report["sd_rmse"] == {"naive": pytest.approx(0.0)}
    assert report["folds"][1]["rmse"]["naive"] == pytest.approx(2.0)
    assert report["global_zscore_failure"]["lstm_rmse"] == pytest.approx(100.0)
    assert "multistep" not in report and report["seconds"] == 1.5


def test_multistep_table_and_figures(tmp_path: Path) -> None:
    x = np.sin(2 * np.pi * np.arange(1200) / 11.0)
    methods: dict[str, MethodFactory] = {
        "naive": lambda: Naive(window=64, horizon=20),
        "seasonal_naive": lambda: SeasonalNaive(window=64, horizon=20),
    }
    fold = evaluate_origin(x, 900, methods, test_size=200, horizon=20)
    text = _render(multistep_table(fold))
    assert "h=1" in text and "h=20" in text and "181 forecast origins" in text
    one_step = evaluate_origin(x, 900, {"naive": lambda: Naive(window=64)}, test_size=200)
    for path in (
        plot_forecasts(one_step, tmp_path / "f.png"),
        plot_horizon(fold, tmp_path / "h.png"),
    ):
        assert path.read_bytes()[:4] == b"\x89PNG"


def test_evaluation_config_refuses_what_it_cannot_run() -> None:
    with pytest.raises(DataError, match="focus origin"):
        EvaluationConfig(origins=(4000, 5000), focus_origin=6000)
    with pytest.raises(DataError, match="horizon"):
        EvaluationConfig(horizon=60)
    config = EvaluationConfig()
    assert config.n_fits == 4 * 5 + 1 + 6
    assert set(config.multistep_methods()) == {
        "naive",
        "seasonal_naive",
        "linear_recursive",
        "linear_direct",
        "lstm_recursive",
        "lstm_direct",
    }
    assert {m().horizon for m in config.multistep_methods().values()} == {20}
