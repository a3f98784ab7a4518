from __future__ import annotations

from pathlib import Path

import pytest

from app.series import Series, read_csv

DATA_DIR = Path(__file__).parent / "data"


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
