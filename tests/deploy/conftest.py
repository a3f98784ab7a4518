"""Paths and tools the deployment tests share."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tool(name: str, package: str) -> str:
    """The tool's path (on PATH or beside this Python, i.e. in the venv), or skip the test."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed ({package}); CI installs it")
    return found
