"""Real model artifacts for tests: the shipped LSTM, calibrated on the lab's hold-out."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from app.forecasting.artifacts import load_model, update_manifest
from app.monitoring.calibration import HoldOut, calibrate_margins
from app.monitoring.residuals import one_step_residuals
from app.series import Series, read_csv

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "lstm-seed0"
LAB_CSV = ROOT / "tests" / "data" / "twin_seed0_lab_faults.csv"
HOLDOUT = slice(6000, 7000)


def lab_series() -> Series:
    return read_csv(LAB_CSV)


def calibrated_lab_model(models_dir: Path, name: str = "lstm-seed0") -> Path:
    """Copy the shipped LSTM into `models_dir` with the lab's margins on hold-out 6000..6999.

    Independent of whatever thresholds the shipped manifest carries, so tests pin behaviour.
    """
    target = models_dir / name
    shutil.copytree(DEFAULT_MODEL, target)
    series = lab_series()
    assert series.reference is not None
    forecaster = load_model(target).forecaster
    residuals = one_step_residuals(forecaster, series.value[:, None])
    gaps = series.value - series.reference
    config = calibrate_margins(HoldOut(residuals[HOLDOUT], gaps[HOLDOUT]))
    update_manifest(target, thresholds=config.model_dump(mode="json"))
    return target


def epoch_times(start: int, stop: int, *, period: float = 0.1, t0: float = 1.7e9) -> np.ndarray:
    """Reading times for samples [start, stop) of a record: t0 + sample * period (epoch s)."""
    return t0 + np.arange(start, stop) * period
