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
from app.registry import (
    SHIPPED_MODELS_DIR,
    load_models,
    manifest_sha256,
    model_directories,
)
from app.settings import Settings

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


def test_a_later_directory_replaces_a_model_of_the_same_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shipped, mine = tmp_path / "shipped", tmp_path / "mine"
    for directory in (shipped / "a", shipped / "b", shipped / "c", mine / "b", mine / "c"):
        directory.mkdir(parents=True)
    (shipped / "c" / "corrupt").touch()  # broken where shipped, fixed in mine
    (mine / "b" / "corrupt").touch()  # yours is broken: nothing is served under that name
    with caplog.at_level("INFO", logger="app.registry"):
        registry = load_models([shipped, mine], loaded_at=NOW, loader=loader)
    assert sorted(model.name for model in registry) == ["a", "c"]
    assert registry.require("c").artifact.directory == mine / "c"
    assert list(registry.errors) == ["b"]
    assert f"model b of {mine} replaces that of {shipped}" in caplog.text


def test_the_shipped_models_come_first_and_the_configured_directory_after(
    tmp_path: Path,
) -> None:
    assert model_directories(Settings()) == [SHIPPED_MODELS_DIR]
    both = Settings(models_dir=tmp_path)
    assert model_directories(both) == [SHIPPED_MODELS_DIR, tmp_path]
    assert model_directories(Settings(models_dir=tmp_path, shipped_models=False)) == [tmp_path]
    shipped = {path.name for path in SHIPPED_MODELS_DIR.iterdir() if path.is_dir()}
    assert Settings().default_model == "auto"  # streams learn their own unless told otherwise
    from app.twin.demo import TWIN_MODEL

    assert TWIN_MODEL in shipped
    assert {"lstm-seed0", "lstm-day-seed3", "lstm-stateful-day-seed3"} <= shipped


def test_manifest_hash_ignores_key_order() -> None:
    assert manifest_sha256({"a": 1, "b": [1, 2]}) == manifest_sha256({"b": [1, 2], "a": 1})
    assert manifest_sha256({"a": 1}) != manifest_sha256({"a": 2})
