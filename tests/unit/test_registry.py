"""The model registry loads every artifact directory and explains the ones it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.errors import ArtifactError, DataError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive
from app.registry import load_models, manifest_sha256

NOW = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _Artifact:
    forecaster: Forecaster
    manifest: dict[str, Any]
    directory: Path


def loader(directory: Path) -> _Artifact:
    if (directory / "corrupt").exists():
        raise ArtifactError(f"{directory}: weights do not match the manifest")
    manifest = {"thresholds": {"point": 0.5}, "config": {"window": 4}}
    return _Artifact(Naive(window=4), manifest, directory)


def test_loads_each_directory_and_reports_failures(tmp_path: Path) -> None:
    for name in ("good", "also-good", "bad", ".hidden", "_scratch", "bad name"):
        (tmp_path / name).mkdir()
    (tmp_path / "bad" / "corrupt").touch()
    (tmp_path / "README.md").write_text("not a model")

    registry = load_models(tmp_path, loaded_at=NOW, loader=loader)

    assert sorted(model.name for model in registry) == ["also-good", "good"]
    assert "good" in registry and "bad" not in registry
    assert "weights do not match" in registry.errors["bad"]
    assert "must match" in registry.errors["bad name"]
    assert ".hidden" not in registry.errors and "_scratch" not in registry.errors
    model = registry.require("good")
    assert model.kind == "naive"
    assert model.thresholds == {"point": 0.5}
    assert model.metrics == {}
    assert model.loaded_at == NOW
    assert model.version == model.manifest_sha256[:12]
    with pytest.raises(DataError, match="'bad' is not loaded \\(loaded: also-good, good\\)"):
        registry.require("bad")


def test_missing_directory_gives_an_empty_registry(tmp_path: Path) -> None:
    registry = load_models(tmp_path / "absent", loaded_at=NOW, loader=loader)
    assert len(registry) == 0
    assert registry.errors == {str(tmp_path / "absent"): "models directory does not exist"}


def test_manifest_hash_ignores_key_order() -> None:
    assert manifest_sha256({"a": 1, "b": [1, 2]}) == manifest_sha256({"b": [1, 2], "a": 1})
    assert manifest_sha256({"a": 1}) != manifest_sha256({"a": 2})
