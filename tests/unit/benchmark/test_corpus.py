"""One command runs a whole corpus: a manifest's sets each with their own learning and protocol,
and a file that fails is that file's error, never the run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from app.benchmark.datasets import LabelledFile
from app.benchmark.manifest import read_manifest
from app.benchmark.report import benchmark
from app.benchmark.runner import FileRun, run_in_process
from app.cli import cli
from tests.unit.benchmark.labelled import labelled_file, write_csv

REPO = Path(__file__).resolve().parents[3]


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["evaluate", "benchmark", *args], env={"COLUMNS": "200"})


def write_sets(root: Path) -> None:
    """Two sets: 'valves' (two files of 300 rows, SKAB's protocol) and 'plant' (one of 250)."""
    write_csv(root / "valves" / "1.csv", labelled_file("1.csv"))
    write_csv(root / "valves" / "2.csv", labelled_file("2.csv", anomaly=(200, 260)))
    write_csv(root / "plant" / "run.csv", labelled_file("run.csv", 250, anomaly=(180, 230)))


def manifest(sets: list[dict[str, Any]]) -> str:
    return json.dumps({"about": "test sets", "sets": sets})


SETS = [
    {"name": "valves", "path": "valves", "learn": 150, "protocol": "skab"},
    {"name": "plant", "path": "plant", "learn": "50%", "sample_period_s": 60},
]


def test_a_manifest_in_the_data_folder_runs_every_set_with_its_own_learning(
    tmp_path: Path,
) -> None:
    write_sets(tmp_path)
    (tmp_path / "benchmarks.json").write_text(manifest(SETS))
    out = tmp_path / "report.json"
    result = run_cli(str(tmp_path), "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "valves: twinwatch and references" in result.output
    assert "plant: twinwatch and references" in result.output
    sets = json.loads(out.read_text())["sets"]
    assert list(sets) == ["valves", "plant"]
    valves, plant = sets["valves"], sets["plant"]
    assert (valves["learn"], valves["window"]) == ("150", "skab")
    assert (plant["learn"], plant["window"], plant["sample_period_s"]) == ("50%", "nab", 60)
    assert [f["learning_rows"] for f in valves["files"]] == [150, 150]
    assert [f["learning_rows"] for f in plant["files"]] == [125]
    assert {f["nab_window_s"] for f in valves["files"]} == {60.0}
    # NAB's rule: a tenth of the 125 scored minutes for the file's one anomaly.
    assert plant["files"][0]["nab_window_s"] == pytest.approx(0.1 * 125 * 60)
    for one in (valves, plant):
        assert one["summary"]["failed"] == 0
        assert set(one["summary"]["references"]) == {
            "windowed_gaussian",
            "ar_residual",
            "hotelling",
        }
        assert one["summary"]["budget"]["files"] == len(one["files"])


def test_a_manifest_elsewhere_reads_its_paths_under_the_data_folder_given(tmp_path: Path) -> None:
    write_sets(tmp_path / "data")
    path = tmp_path / "bench" / "benchmarks.json"
    path.parent.mkdir()
    path.write_text(manifest(SETS[1:]))
    out = tmp_path / "report.json"
    result = run_cli(
        "--manifest", str(path), str(tmp_path / "data"), "--json", str(out), "--no-references"
    )
    assert result.exit_code == 0, result.output
    plant = json.loads(out.read_text())["sets"]["plant"]
    assert plant["summary"]["references"] == {}
    refused = run_cli("--manifest", str(path), str(tmp_path / "data"), "--learn", "100")
    assert refused.exit_code != 0  # each set has its own learning


def test_without_a_manifest_one_set_is_run_as_before(tmp_path: Path) -> None:
    write_sets(tmp_path)
    out = tmp_path / "report.json"
    result = run_cli(
        str(tmp_path / "valves"), "--learn", "150", "--window", "skab", "--json", str(out)
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "sets" not in report
    assert (report["learn"], report["window"], len(report["files"])) == ("150", "skab", 2)


def test_the_projects_manifest_lists_the_three_shared_sets(tmp_path: Path) -> None:
    for folder in ("skab/data", "corpus/tep", "corpus/smap_msl"):
        (tmp_path / folder).mkdir(parents=True)
    sets = read_manifest(REPO / "bench" / "benchmarks.json", tmp_path)
    assert [(s.name, s.learn, s.window) for s in sets] == [
        ("skab-valve", "400", "skab"),
        ("tep", "160", "nab"),
        ("smap-msl", "2000", "nab"),
    ]
    assert sets[1].path == tmp_path / "corpus" / "tep"


def test_a_file_whose_stream_cannot_learn_is_its_own_error(tmp_path: Path) -> None:
    silent = labelled_file("silent.csv")
    silent.values[:150, 1] = np.nan  # a channel without a number while learning
    files = [labelled_file("a.csv"), silent, labelled_file("b.csv")]
    report = benchmark(files, learn="150")
    entries = {f["file"]: f for f in report["files"]}
    assert entries["silent.csv"]["error"]["type"] == "DataError"
    assert "no number" in entries["silent.csv"]["error"]["message"]
    assert "error" not in entries["a.csv"] and "error" not in entries["b.csv"]
    assert (report["summary"]["files"], report["summary"]["failed"]) == (2, 1)
    # The references learn from the other channel and score the file.
    assert report["summary"]["references"]["ar_residual"]["files"] == 3


def test_any_exception_from_one_file_is_recorded_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fragile(labelled: LabelledFile, learn_rows: int, **kwargs: Any) -> FileRun:
        if labelled.name == "2.csv":
            raise ValueError("mahalanobis: the covariance is not positive definite")
        return run_in_process(labelled, learn_rows, **kwargs)

    monkeypatch.setattr("app.benchmark.report.run_in_process", fragile)
    write_sets(tmp_path)
    (tmp_path / "valves" / "3.csv").write_text(
        "datetime;c0;anomaly\n2024-01-01 00:00:00;not a number;0\n"
    )
    out = tmp_path / "report.json"
    result = run_cli(str(tmp_path / "valves"), "--learn", "150", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "2 failed" in result.output
    assert "2.csv (twinwatch): ValueError: mahalanobis" in result.output
    entries = {f["file"]: f for f in json.loads(out.read_text())["files"]}
    assert entries["2.csv"]["error"] == {
        "type": "ValueError",
        "message": "mahalanobis: the covariance is not positive definite",
    }
    assert entries["3.csv"]["error"]["type"] == "DataError"  # it does not parse
    assert "confusion" in entries["1.csv"]


def test_the_exit_code_fails_only_when_every_file_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(*args: Any, **kwargs: Any) -> FileRun:
        raise RuntimeError("no stream takes this")

    monkeypatch.setattr("app.benchmark.report.run_in_process", broken)
    write_sets(tmp_path)
    result = run_cli(str(tmp_path / "valves"), "--learn", "150", "--no-references")
    assert result.exit_code == 1
    assert "2 failed" in result.output


def test_hotelling_skips_a_single_channel_file() -> None:
    report = benchmark([labelled_file("one.csv", channels=1)], learn="150")
    (entry,) = report["files"]
    assert entry["references"]["hotelling"] == {"skipped": "needs 2 channels or more"}
    hotelling = report["summary"]["references"]["hotelling"]
    assert (hotelling["files"], hotelling["skipped"], hotelling["failed"]) == (0, 1, 0)
    assert "confusion" in entry["references"]["windowed_gaussian"]
