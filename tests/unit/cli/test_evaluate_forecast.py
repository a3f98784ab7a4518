from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from app.cli import cli, main
from app.series import Series, write_csv

ONE_STEP = {"naive", "seasonal_naive", "linear_ar", "lstm", "lstm_stateful"}
MULTISTEP = {
    "naive",
    "seasonal_naive",
    "linear_recursive",
    "linear_direct",
    "lstm_recursive",
    "lstm_direct",
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("quick")
    result = CliRunner().invoke(
        cli,
        [
            "evaluate",
            "forecast",
            "--data",
            str(data_dir / "twin_seed0.csv"),
            "--origins",
            "4000,5000,6000,7000",
            "--quick",
            "--json",
            str(out / "report.json"),
            "--plots",
            str(out / "plots"),
        ],
    )
    assert result.exit_code == 0, result.output
    return result.output, out


def test_quick_run_writes_a_json_report_with_every_key(quick_run: tuple[str, Path]) -> None:
    _, out = quick_run
    report = json.loads((out / "report.json").read_text())
    assert {"folds", "mean_rmse", "global_zscore_failure", "multistep", "seconds"} <= set(report)
    assert [fold["origin"] for fold in report["folds"]] == [4000, 5000, 6000, 7000]
    for fold in report["folds"]:
        for metric in ("rmse", "mae", "mase"):
            assert set(fold[metric]) == ONE_STEP
            assert all(np.isfinite(v) and v > 0 for v in fold[metric].values())
        assert fold["targets"] == 200  # --quick's test block
    assert set(report["mean_rmse"]) == ONE_STEP
    failure = report["global_zscore_failure"]
    assert failure["origin"] == 6000
    assert {"lstm_rmse", "naive_rmse", "mean_error"} <= set(failure)
    assert failure["naive_rmse"] == report["folds"][2]["rmse"]["naive"]  # the same targets
    multistep = report["multistep"]
    assert multistep["horizons"] == list(range(1, 21))
    assert set(multistep["rmse"]) == MULTISTEP
    assert all(len(values) == 20 for values in multistep["rmse"].values())
    # honest: the multi-step fits stop h samples before the origin
    assert multistep["train_samples"][1] == 6000 - 20
    assert report["config"]["training"]["epochs"] == 1
    assert report["seconds"] > 0


def test_quick_run_prints_the_tables_and_draws_the_figures(quick_run: tuple[str, Path]) -> None:
    output, out = quick_run
    for title in ("Walk-forward RMSE", "MASE", "input range", "Global z-score", "Multi-step"):
        assert title in output
    assert "mean error (forecast - actual)" in output
    for name in ("forecasts.png", "horizon.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def short_csv(tmp_path: Path, seed0: Series) -> Path:
    """The first 2,000 samples, with one reading missing at sample 1800."""
    value = seed0.value[:2000].copy()
    value[1800] = np.nan
    path = tmp_path / "short.csv"
    write_csv(Series(t=seed0.t[:2000], columns={"value": value}), path)
    return path


def _run_main(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["twinwatch", "evaluate", "forecast", *args])
    monkeypatch.setenv("COLUMNS", "1000")  # so rich does not wrap the message itself
    with pytest.raises(SystemExit) as exit_info:
        main()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "{missing}"], "no such file"),
        (["--data", "{wrong}"], "expected 't,value'"),
        (["--data", "{short}", "--origins", "1000,x"], "comma-separated integers"),
        (["--data", "{short}", "--origins", "1200,1000"], "must increase"),
        (["--data", "{short}", "--origins", "100,1000"], "too little training data"),
        (["--data", "{short}", "--origins", "1000,1900"], "runs past the end"),
        (["--data", "{short}", "--origins", "1000,1500", "--test-size", "400"], "sample 1800"),
        (["--data", "{short}", "--origins", "1000,1200", "--focus-origin", "900"], "focus"),
        (["--data", "{short}", "--origins", "1000", "--epochs", "0"], "--epochs"),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_code_2(
    args: list[str],
    message: str,
    short_csv: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("time,reading\n0,1\n")
    paths = {"missing": tmp_path / "nope.csv", "wrong": wrong, "short": short_csv}
    code, err = _run_main([a.format(**paths) for a in args], monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in err


def test_nan_outside_the_evaluated_samples_is_no_obstacle(short_csv: Path, tmp_path: Path) -> None:
    """Sample 1800 is missing, but origins 900 and 1100 with blocks of 300 stop at 1399."""
    result = CliRunner().invoke(
        cli,
        [
            "evaluate",
            "forecast",
            "--data",
            str(short_csv),
            "--origins",
            "900,1100",
            "--quick",
            "--test-size",
            "300",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert [fold["targets"] for fold in report["folds"]] == [300, 300]
    assert report["global_zscore_failure"]["origin"] == 1100  # 6000 absent: the last origin
