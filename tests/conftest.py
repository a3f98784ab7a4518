from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.series import Series, read_csv

DATA_DIR = Path(__file__).parent / "data"

# The compose stack's test needs the images deploy/container-check.sh builds: that script sets
# TWINWATCH_CONTAINER_STACK and runs it (CI does, through .ci/run).
collect_ignore = [] if os.environ.get("TWINWATCH_CONTAINER_STACK") else ["containers"]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA_DIR


@pytest.fixture(scope="session")
def seed0() -> Series:
    """The reference twin output for seed 0 (8,000 samples, stored in tests/data), independent of
    our simulator."""
    return read_csv(DATA_DIR / "twin_seed0.csv")


@pytest.fixture(scope="session")
def seed0_lab() -> Series:
    return read_csv(DATA_DIR / "twin_seed0_lab_faults.csv")
