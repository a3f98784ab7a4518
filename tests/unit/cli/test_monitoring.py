from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.forecasting.artifacts import load_model, save_model
from app.forecasting.linear_ar import LinearAR
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.config import MonitorConfig
from app.series import Series, read_csv, write_csv
from app.simulation.twin import simulate_series

LAB = "twin_seed0_lab_faults"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A linear AR trained on seed 0 up to 6000, saved like `twinwatch train` saves models."""
    series = read_csv(data_dir / "twin_seed0.csv")
    directory = tmp_path_factory.mktemp("models") / "linear"
    forecaster = LinearAR().fit(series.matrix(["value"]), train_end=6000)
    extra = {"training": {"data_sha256": series.sha256(), "train_end": 6000}}
    return save_model(forecaster, directory, extra=extra)


@pytest.fixture()
def model(trained: Path, tmp_path: Path) -> Path:
    """A fresh copy per test: calibrate writes into the manifest."""
    return Path(shutil.copytree(trained, tmp_path / "model"))


def run(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["twinwatch", *args])
    monkeypatch.setenv("COLUMNS", "1000")  # so rich does not wrap the message itself
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_calibrate_writes_thresholds_into_the_manifest(
    model: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["calibrate", "--model", str(model), "--data", str(data_dir / "twin_seed0.csv")]
    args += ["--holdout", "6000:7000", "--open-after", "2", "--open-window", "3"]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    assert "wrote the thresholds" in out
    config = MonitorConfig.from_manifest(load_model(model).manifest)
    assert config.alarm == AlarmPolicy(k=2, n=3, m=20)
    assert set(config.thresholds()) == {"point", "rolling_rms", "variance_floor", "cusum", "level"}
    assert config.calibration["holdout"]["start"] == 6000
    assert config.calibration["holdout"]["stop"] == 7000
    assert load_model(model).manifest["training"]["train_end"] == 6000  # the rest is kept


def test_calibrate_for_a_rate_says_what_the_holdout_supports(
    model: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["calibrate", "--model", str(model), "--data", str(data_dir / "twin_seed0.csv")]
    args += ["--holdout", "6000:8000", "--false-alarms-per-day", "1", "--close-after", "30"]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    assert "resolves rates down to" in out and "generalised Pareto" in out
    config = MonitorConfig.from_manifest(load_model(model).manifest)
    assert config.calibration["false_alarms_per_day"] == 1.0
    assert config.calibration["sample_period_s"] == pytest.approx(0.1)  # from the data's t
    assert config.alarm.m == 30


def test_calibrate_on_a_separate_file_of_normal_operation(
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    holdout = tmp_path / "normal_seed3.csv"
    write_csv(simulate_series(3, 3000), holdout)
    args = ["calibrate", "--model", str(model), "--data", str(holdout), "--holdout", "all"]
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    calibration = MonitorConfig.from_manifest(load_model(model).manifest).calibration
    assert calibration["holdout"]["data"] == str(holdout)
    assert (calibration["holdout"]["start"], calibration["holdout"]["stop"]) == (0, 3000)
    assert calibration["holdout"]["valid_samples"] == 3000 - 64  # the first window has no forecast


def test_evaluate_monitor_writes_the_report_of_the_issue(
    model: Path,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report_path = tmp_path / "out" / "report.json"
    args = ["evaluate", "monitor", "--model", str(model), "--data", str(data_dir / f"{LAB}.csv")]
    args += ["--faults", str(data_dir / f"{LAB}.faults.json"), "--holdout", "6000:7000"]
    args += ["--json", str(report_path), "--plots", str(tmp_path / "plots")]
    args += ["--normal-days", "0.01", "--seed", "5"]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    report = json.loads(report_path.read_text())
    assert [f["type"] for f in report["faults"]] == ["spike", "offset", "excitation", "stuck"]
    spike = report["faults"][0]
    assert (spike["start"], spike["end"]) == (7100, 7101)
    assert set(spike["detectors"]) == {"point", "rolling_rms", "variance_floor", "cusum", "level"}
    assert set(spike["detectors"]["point"]) == {"events", "alarm_samples", "first_delay"}
    assert spike["detectors"]["point"]["first_delay"] == 0
    assert report["normal_samples"] == 239
    assert "any" in report["false_alarm_events_per_day"]
    assert set(report["thresholds"]) == set(spike["detectors"])
    assert report["normal_days"]["days"] == 0.01 and report["normal_days"]["seed"] == 5
    assert "any" in report["normal_days"]["false_alarm_events_per_day"]
    assert report["seconds"] > 0
    assert (tmp_path / "plots" / "monitor.png").is_file()
    assert "spike 7100" in out


def test_evaluate_monitor_uses_the_manifest_thresholds_without_holdout(
    model: Path,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lab = ["--data", str(data_dir / f"{LAB}.csv"), "--faults", str(data_dir / f"{LAB}.faults.json")]
    evaluate = ["evaluate", "monitor", "--model", str(model), *lab]
    evaluate += ["--json", str(tmp_path / "r.json")]
    code, _, err = run(evaluate, monkeypatch, capsys)
    assert code == 2 and "run `twinwatch calibrate`" in err
    calibrate = ["calibrate", "--model", str(model), "--data", str(data_dir / "twin_seed0.csv")]
    assert run([*calibrate, "--holdout", "6000:7000"], monkeypatch, capsys)[0] == 0
    code, _, err = run(evaluate, monkeypatch, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["scored_from"] == 6000  # everything the model never trained on
    assert report["calibration"]["holdout"]["stop"] == 7000


@pytest.fixture()
def bad_inputs(tmp_path: Path, data_dir: Path) -> dict[str, Path]:
    broken = tmp_path / "broken.faults.json"
    broken.write_text("[{")
    unknown = tmp_path / "unknown.faults.json"
    unknown.write_text('[{"type": "meteor", "start": 7000, "end": 7010}]')
    late = tmp_path / "late.faults.json"
    late.write_text('[{"type": "spike", "start": 7990, "end": 8010}]')
    lab = read_csv(data_dir / f"{LAB}.csv")
    short = tmp_path / "short.csv"
    write_csv(Series(t=lab.t[:150], columns={"value": lab.value[:150]}), short)
    return {
        "missing": tmp_path / "nope.csv",
        "broken": broken,
        "unknown": unknown,
        "late": late,
        "short": short,
        "lab": data_dir / f"{LAB}.csv",
        "clean": data_dir / "twin_seed0.csv",
        "faults": data_dir / f"{LAB}.faults.json",
        "out": tmp_path / "r.json",
    }


EVALUATE = ["evaluate", "monitor", "--model", "{model}", "--json", "{out}"]
CALIBRATE = ["calibrate", "--model", "{model}"]
RATE = ["--false-alarms-per-day"]
OPEN = ["--open-after"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*CALIBRATE, "--data", "{missing}", "--holdout", "0:100"], "no such file"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "7000"], "must be START:STOP"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "7000:6000"], "START < STOP"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "6000:9000"], "runs past the end"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "5000:7000"], "trained on"),
        ([*CALIBRATE, "--data", "{short}", "--holdout", "all"], "need at least"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "6000:7000", *OPEN, "3"], "cannot exceed"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "6000:7000", *OPEN, "0"], "at least 1"),
        ([*CALIBRATE, "--data", "{clean}", "--holdout", "6000:7000", *RATE, "-1"], "positive"),
        ([*EVALUATE, "--data", "{lab}", "--faults", "{missing}"], "no such file"),
        ([*EVALUATE, "--data", "{lab}", "--faults", "{broken}"], "not valid JSON"),
        ([*EVALUATE, "--data", "{lab}", "--faults", "{unknown}"], "fault #0"),
        ([*EVALUATE, "--data", "{lab}", "--faults", "{late}"], "after the 8000 samples"),
        (
            [*EVALUATE, "--data", "{lab}", "--faults", "{faults}", "--holdout", "6500:7200"],
            "overlaps the spike fault",
        ),
        (
            [*EVALUATE, "--data", "{lab}", "--faults", "{faults}", "--normal-days", "1"],
            "--normal-days needs",
        ),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_code_2(
    args: list[str],
    message: str,
    model: Path,
    bad_inputs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {**bad_inputs, "model": model}
    code, _, err = run([a.format(**paths) for a in args], monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and message in lines[0], lines[0]


def test_a_missing_model_is_a_one_line_error(
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["calibrate", "--model", str(tmp_path / "none"), "--data"]
    args += [str(data_dir / "twin_seed0.csv"), "--holdout", "6000:7000"]
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 2 and "no model directory" in err


def test_evaluate_monitor_names_a_shipped_model(
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no folder of that name here: the shipped model
    report = tmp_path / "report.json"
    args = ["evaluate", "monitor", "--model", "lstm-seed0", "--data", str(data_dir / f"{LAB}.csv")]
    args += ["--faults", str(data_dir / f"{LAB}.faults.json"), "--json", str(report)]
    code, _, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(report.read_text())["model"].endswith("shipped_models/lstm-seed0")
