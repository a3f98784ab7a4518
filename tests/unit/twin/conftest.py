"""A calibrated default model for tests that run the real service."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from app.monitoring.workflow import calibrate

REPO = Path(__file__).resolve().parents[3]
LAB_DATA = REPO / "tests" / "data" / "twin_seed0_lab_faults.csv"


def calibrated_models_dir(scratch: Path) -> Path:
    """`models/` if its default model carries thresholds, else a calibrated copy in `scratch`.

    The copy is calibrated exactly as the README says (`twinwatch calibrate --holdout
    6000:7000` on the lab data), so the tests run the same detectors either way.
    """
    source = REPO / "models" / "lstm-seed0"
    if json.loads((source / "manifest.json").read_text()).get("thresholds"):
        return REPO / "models"
    shutil.copytree(source, scratch / "lstm-seed0")
    calibrate(scratch / "lstm-seed0", LAB_DATA, "6000:7000")
    return scratch


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return calibrated_models_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's TWINWATCH_* variables must not change what the tests see."""
    for name in list(os.environ):
        if name.startswith("TWINWATCH_"):
            monkeypatch.delenv(name)
