"""Real model artifacts for tests: the shipped LSTM and a stateful one, calibrated on the lab's
hold-out."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from app.forecasting.artifacts import save_model
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig
from app.monitoring.workflow import calibrate
from app.registry import SHIPPED_MODELS_DIR
from app.series import Series, read_csv

ROOT = Path(__file__).resolve().parents[2]
LAB_MODEL = SHIPPED_MODELS_DIR / "lstm-seed0"  # trained on seed 0 up to sample 6000
LAB_CSV = ROOT / "tests" / "data" / "twin_seed0_lab_faults.csv"


def lab_series() -> Series:
    return read_csv(LAB_CSV)


def calibrated_lab_model(models_dir: Path, name: str = "lstm-seed0") -> Path:
    """Copy the shipped LSTM into `models_dir`, calibrated at the default fixed margins
    (`calibration.Margins`: point 4 sigma, rolling RMS 1.1 x its hold-out maximum, ...) on
    hold-out 6000..6999.

    Exactly `twinwatch calibrate --holdout 6000:7000` on the lab data, and independent of the
    thresholds the shipped manifest carries, so tests pin behaviour.
    """
    target = models_dir / name
    shutil.copytree(LAB_MODEL, target)
    calibrate(target, LAB_CSV, "6000:7000")
    return target


def epoch_times(start: int, stop: int, *, period: float = 0.1, t0: float = 1.7e9) -> np.ndarray:
    """Reading times for samples [start, stop) of a record: t0 + sample * period (epoch s)."""
    return t0 + np.arange(start, stop) * period


STATEFUL_LAB_TRAINING = TrainingConfig(epochs=12, batch_size=4, patience=4)


def stateful_lab_model(models_dir: Path, name: str = "lstm-stateful-lab") -> Path:
    """A stateful LSTM trained on seed 0 up to sample 6000 (a few seconds), calibrated
    at the default fixed margins on hold-out 6000..6999 like `calibrated_lab_model`."""
    target = models_dir / name
    seed0 = read_csv(ROOT / "tests" / "data" / "twin_seed0.csv")
    model = StatefulLSTMForecaster(training=STATEFUL_LAB_TRAINING)
    model.fit(seed0.value[:, None], train_end=6000)
    save_model(
        model,
        target,
        extra={"channels": ["value"], "training": {"data": "tests/data/twin_seed0.csv"}},
    )
    calibrate(target, LAB_CSV, "6000:7000")
    return target


def lab_readings(first: int, stop: int) -> dict[str, Any]:
    """Readings `first`..`stop` of the lab record (from its start again past its end)."""
    record = lab_series().value
    times = epoch_times(first, stop)
    values = record[np.arange(first, stop) % record.shape[0]]
    readings = [{"t": float(t), "value": float(v)} for t, v in zip(times, values, strict=True)]
    return {"readings": readings}
