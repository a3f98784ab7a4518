"""`twinwatch calibrate` sets exactly the thresholds that the live service's own statistics of
the record give: calibration runs the recurrence that raises the service's alarms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.monitoring.calibration import Margins, budget_shares, margin_threshold, rate_threshold
from app.monitoring.config import MonitorConfig, build_detector
from app.monitoring.workflow import calibrate
from app.settings import Settings
from app.storage.db import Database
from tests.support.models import LAB_CSV, LAB_MODEL, epoch_times, lab_series

HOLDOUT = (6000, 7000)
NEVER = 1e300


def watching(config: MonitorConfig) -> dict[str, Any]:
    """The calibrated detectors with thresholds they never reach: only statistics wanted."""
    detectors = []
    for detector in config.model_dump(mode="json")["detectors"]:
        below = build_detector(config.detector(detector["kind"])).direction == "below"  # type: ignore[arg-type]
        detectors.append({**detector, "threshold": 5e-324 if below else NEVER})
    return {**config.model_dump(mode="json"), "detectors": detectors, "calibration": {}}


def live_statistics(
    models: Path, database: Database, tmp_path: Path
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Residuals and statistics the service gives for the record, posted in uneven batches."""
    series = lab_series()
    assert series.reference is not None
    times = epoch_times(0, HOLDOUT[1])
    settings = Settings(
        database_url=database.url,
        models_dir=models,
        data_dir=tmp_path / "data",
        default_model="watch",
        migrate_on_start=False,
    )
    residuals: list[float] = []
    statistics: dict[str, list[float]] = {}
    with TestClient(create_app(settings)) as client:
        assert client.put("/v1/streams/s", json={"has_reference": True}).status_code == 201
        start = 0
        sizes = iter([1, 500, 7, 64, 1000, 3] * 200)
        while start < HOLDOUT[1]:
            stop = min(HOLDOUT[1], start + next(sizes))
            body = {
                "readings": [
                    {
                        "t": float(times[i]),
                        "value": float(series.value[i]),
                        "reference": float(series.reference[i]),
                    }
                    for i in range(start, stop)
                ]
            }
            answer = client.post("/v1/streams/s/readings", json=body)
            assert answer.status_code == 200, answer.text
            for result in answer.json()["results"]:
                residuals.append(np.nan if result["residual"] is None else result["residual"])
                for kind, value in result["statistics"].items():
                    statistics.setdefault(kind, []).append(np.nan if value is None else value)
            start = stop
    span = slice(*HOLDOUT)
    return np.array(residuals)[span], {k: np.array(v)[span] for k, v in statistics.items()}


@pytest.mark.parametrize("rate", [None, 20.0])
def test_calibrate_gives_the_thresholds_of_the_services_own_statistics(
    database: Database, tmp_path: Path, rate: float | None
) -> None:
    models = tmp_path / "models"
    model = models / "lab"
    shutil.copytree(LAB_MODEL, model)
    calibrated = calibrate(model, LAB_CSV, "6000:7000", false_alarms_per_day=rate)
    watch = models / "watch"
    shutil.copytree(model, watch)
    manifest = json.loads((watch / "manifest.json").read_text())
    (watch / "manifest.json").write_text(
        json.dumps({**manifest, "thresholds": watching(calibrated)})
    )

    residuals, statistics = live_statistics(models, database, tmp_path)

    sigma = float(np.std(residuals[~np.isnan(residuals)]))
    assert sigma == calibrated.calibration["sigma"]
    shares = budget_shares([d.kind for d in calibrated.detectors])
    for detector in calibrated.detectors:
        kind = detector.kind
        if rate is None:
            expected = margin_threshold(kind, statistics[kind], sigma, Margins())
        else:
            expected = rate_threshold(
                statistics[kind],
                build_detector(detector).direction,
                detector.alarm or calibrated.alarm,
                rate * shares[kind] / (86_400 / calibrated.calibration["sample_period_s"]),
            ).threshold
        assert detector.threshold == expected, kind  # exactly
