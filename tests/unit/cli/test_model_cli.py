from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.forecasting.artifacts import GRAPH_FILE, MANIFEST_FILE, load_model, save_model
from app.forecasting.baselines import Naive
from app.registry import SHIPPED_MODELS_DIR

SHIPPED = SHIPPED_MODELS_DIR / "lstm-seed0"


def run(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Exactly what a user's shell sees: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["twinwatch", "model", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def graphless(tmp_path: Path) -> Path:
    """The shipped model as an earlier twinwatch wrote it: format 1, weights only."""
    directory = tmp_path / "old"
    shutil.copytree(SHIPPED, directory)
    (directory / GRAPH_FILE).unlink()
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    del manifest["graph_sha256"]
    (directory / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 1}))
    return directory


def test_export_graph_gives_an_old_artifact_the_shipped_graph(
    graphless: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["export-graph", str(graphless)], monkeypatch, capsys)
    assert code == 0
    assert f"wrote {graphless / GRAPH_FILE}" in out
    assert (graphless / GRAPH_FILE).read_bytes() == (SHIPPED / GRAPH_FILE).read_bytes()
    assert (
        load_model(graphless).manifest["graph_sha256"]
        == (load_model(SHIPPED).manifest["graph_sha256"])
    )


def test_export_graph_without_torch_says_what_to_install(
    graphless: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    code, _, err = run(["export-graph", str(graphless)], monkeypatch, capsys)
    assert code == 2
    assert "needs torch" in err and "twinwatch[train]" in err
    assert "Traceback" not in err
    assert not (graphless / GRAPH_FILE).exists()


def test_export_graph_refuses_what_it_cannot_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    naive = save_model(Naive(window=4), tmp_path / "naive")
    code, _, err = run(["export-graph", str(naive)], monkeypatch, capsys)
    assert (code, err.count("\n")) == (2, 1)
    assert "forecasts without a graph" in err
    code, _, err = run(["export-graph", str(tmp_path / "nowhere")], monkeypatch, capsys)
    assert (code, "no model directory" in err) == (2, True)
