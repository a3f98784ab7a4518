from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.forecasting.artifacts import MANIFEST_FILE, load_model
from app.series import Series, read_csv, write_csv


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory, seed0: Series) -> tuple[Path, Series]:
    """The first 1500 samples of the reference twin."""
    series = Series(t=seed0.t[:1500], columns={k: v[:1500] for k, v in seed0.columns.items()})
    path = tmp_path_factory.mktemp("data") / "short.csv"
    write_csv(series, path)
    return path, series


def run(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Exactly what a user's shell sees: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["twinwatch", "train", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trains_an_lstm_prints_its_progress_and_saves_it(
    short: tuple[Path, Series],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, series = short
    out = tmp_path / "models" / "tiny"
    args = ["--data", str(path), "--train-end", "1000", "--window", "16", "--epochs", "2"]
    code, stdout, stderr = run(
        [*args, "--validation-samples", "100", "--out", str(out)], monkeypatch, capsys
    )
    assert code == 0, stderr
    assert "training inputs 0..999" in stdout
    assert "test inputs 1000..1499" in stdout
    assert "epoch  2/2" in stdout and "grad norm before clip" in stdout
    assert "100%" in stderr  # the progress bar
    assert "validation RMSE" in stdout
    assert "test RMSE" in stdout and "vs naive" in stdout
    loaded = load_model(out)
    manifest = loaded.manifest
    assert manifest["kind"] == "lstm"
    assert manifest["channels"] == ["value"]
    assert manifest["training"]["data_sha256"] == series.sha256()
    assert manifest["training"]["train_end"] == 1000
    assert manifest["training"]["data"] == str(path)
    assert manifest["training"]["input_range"]["test"][1] == pytest.approx(
        series.value[1000:].max()
    )
    assert manifest["metrics"]["test"]["samples"] == 500
    assert manifest["training"]["history"]["epochs_run"] == 2
    # Retraining into the same model directory replaces the model.
    code, _, stderr = run(
        [*args, "--validation-samples", "100", "--seed", "1", "--out", str(out)],
        monkeypatch,
        capsys,
    )
    assert code == 0, stderr
    assert load_model(out).manifest["config"]["training"]["seed"] == 1


def test_trains_a_two_channel_linear_ar(
    short: tuple[Path, Series],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = short
    out = tmp_path / "linear"
    code, _, stderr = run(
        [
            "--data",
            str(path),
            "--train-end",
            "1200",
            "--kind",
            "linear-ar",
            "--horizon",
            "5",
            "--channels",
            "value,reference",
            "--out",
            str(out),
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, stderr
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["channels"] == ["value", "reference"]
    assert manifest["horizon"] == 5
    assert len(manifest["metrics"]["test"]["rmse_by_step"]) == 5
    assert 0 < manifest["metrics"]["validation_rmse"] < 1
    assert load_model(out).forecaster.n_channels == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--data": "missing.csv"}, "no such file"),
        ({"--data": "wrong_columns.csv"}, "expected 't,value'"),
        ({"--channels": "value,load"}, "unknown channel(s) load"),
        ({"--channels": "value,,reference"}, "empty name"),
        ({"--data": "with_nan.csv"}, "first at sample 321"),
        ({"--train-end": "2000"}, "beyond the data: "),
        ({"--train-end": "0"}, "outside the data"),
        ({"--train-end": "500"}, "too small for a window of 64, a validation block of 500"),
        ({"--horizon": "0"}, "--horizon must be at least 1"),
        ({"--epochs": "0"}, "epochs must be at least 1"),
        ({"--out": "a_file"}, "exists and is not a directory"),
        ({"--out": "not_a_model"}, "non-empty directory that holds no model"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    change: dict[str, str],
    message: str,
    short: tuple[Path, Series],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = short
    (tmp_path / "wrong_columns.csv").write_text("time,reading\n0,1\n")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "not_a_model" / "notes.txt").write_text("mine")
    with_nan = read_csv(path)
    with_nan.columns["value"][321] = np.nan
    write_csv(with_nan, tmp_path / "with_nan.csv")
    options = {
        "--data": str(path),
        "--train-end": "1000",
        "--out": str(tmp_path / "model"),
        "--epochs": "1",
    }
    options.update(
        {k: (str(tmp_path / v) if k in ("--data", "--out") else v) for k, v in change.items()}
    )
    code, stdout, stderr = run(
        [item for pair in options.items() for item in pair], monkeypatch, capsys
    )
    assert code == 2
    assert stderr.strip().count("\n") == 0, stderr
    assert message in stderr
    assert "Traceback" not in stdout + stderr
    assert not (tmp_path / "model").exists()  # nothing half-written
