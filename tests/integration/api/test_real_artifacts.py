"""The app loads real artifacts written by `save_model` (no fake loader)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from app.forecasting.artifacts import WEIGHTS_FILE, save_model, update_manifest
from app.forecasting.baselines import Naive
from app.forecasting.linear_ar import LinearAR
from app.main import create_app
from app.settings import Settings
from app.storage.db import Database
from tests.integration.conftest import LAB_LIKE_THRESHOLDS


def test_saved_artifacts_are_served(database: Database, tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    save_model(Naive(window=16), models_dir / "lstm-seed0", extra={"metrics": {"rmse": 0.36}})
    series = np.sin(np.arange(400) / 7.0)
    save_model(LinearAR(window=16).fit(series, train_end=300), models_dir / "ar16")
    update_manifest(models_dir / "ar16", thresholds=LAB_LIKE_THRESHOLDS)
    tampered = save_model(LinearAR(window=16).fit(series, train_end=300), models_dir / "tampered")
    weights = tampered / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-8])

    settings = Settings(
        database_url=database.url,
        models_dir=models_dir,
        default_model="lstm-seed0",
        data_dir=tmp_path / "data",
        migrate_on_start=False,
    )
    with TestClient(create_app(settings)) as client:
        models = {item["name"]: item for item in client.get("/v1/models").json()["items"]}
        # The shipped models beside the directory's, whose lstm-seed0 replaces the shipped one.
        assert set(models) == {"lstm-seed0", "ar16", "lstm-day-seed3", "lstm-stateful-day-seed3"}
        assert models["ar16"]["kind"] == "linear-ar"
        assert models["ar16"]["window"] == 16
        assert models["lstm-seed0"]["metrics"] == {"rmse": 0.36}
        assert client.get("/readyz").status_code == 200
        created = client.put("/v1/streams/pump-1", json={"model": "ar16"})
        assert created.status_code == 201
        assert created.json()["channels"] == ["value"]
        refused = client.put("/v1/streams/pump-2", json={"model": "tampered"})
        assert refused.status_code == 422
        assert "tampered" in refused.json()["detail"]
