"""A calibrated default model for tests that run the real service."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.models import calibrated_lab_model


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped LSTM, calibrated at the default fixed margins on hold-out 6000..6999."""
    directory = tmp_path_factory.mktemp("models")
    calibrated_lab_model(directory)
    return directory


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's TWINWATCH_* variables must not change what the tests see."""
    for name in list(os.environ):
        if name.startswith("TWINWATCH_"):
            monkeypatch.delenv(name)
