"""The model catalogue: every version of every model in the database (`model_versions`), its
artifact in the content-addressed store (`app/storage/artifact_store.py`), the loaded ones in
the registry (`app/registry.py`).

At start-up each models directory's artifact becomes a version of its name (the version that
already holds that artifact, or the next number) and the name's active version: what a stream
runs unless it names a version. The versions streams name (after a promotion or a rollback)
are loaded from the store.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

from app.errors import AppError, ArtifactError
from app.registry import (
    AUTO,
    ArtifactLoader,
    ModelRegistry,
    RegisteredModel,
    default_loader,
    register,
)
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.models import ModelVersion
from app.storage.repositories import model_entries
from app.storage.repositories import model_versions as version_repo

log = logging.getLogger(__name__)


def register_models(
    database: Database,
    registry: ModelRegistry,
    store: ArtifactStore | None = None,
    *,
    loader: ArtifactLoader = default_loader,
) -> ModelRegistry:
    """Record what was loaded, so alarms and audits name the exact version, with the model
    "auto" of streams that learn their own; returns the registry with its versions numbered
    and the versions streams name loaded beside. Without a `store`, artifacts are not kept
    (only the active versions can run)."""
    now = datetime.now(UTC)
    numbered: dict[str, RegisteredModel] = {}
    with database.session() as session:
        model_entries.upsert(
            session,
            name=AUTO,
            version="1",
            kind="learned",
            manifest_sha256="",
            config={"kind": "learned", "description": "each stream learns its own model"},
            metrics={},
            thresholds={},
            loaded_at=now,
        )
        for model in registry:
            sha = model.manifest_sha256
            if store is not None:
                store.put(model.artifact.directory, sha)
            entry = model_entries.upsert(
                session,
                name=model.name,
                version=model.version,
                kind=model.kind,
                manifest_sha256=sha,
                config=model.forecaster.config(),
                metrics=model.metrics,
                thresholds=model.thresholds,
                loaded_at=model.loaded_at,
            )
            row = version_repo.with_artifact(session, model.name, sha)
            if row is None:
                row = version_repo.create(
                    session,
                    name=model.name,
                    kind=model.kind,
                    artifact_sha256=sha,
                    source={"directory": str(model.artifact.directory)},
                    metrics=model.metrics,
                    thresholds=model.thresholds,
                    calibration=dict(model.manifest.get("calibration") or {}),
                    created_by="models directory",
                    now=now,
                )
                log.info("model %s: its directory holds version %d", model.name, row.version)
            entry.active_version = row.version
            entry.version = str(row.version)
            version_repo.refresh_statuses(session, model.name)
            numbered[model.name] = replace(model, version=str(row.version))
        errors = dict(registry.errors)
        catalogue = ModelRegistry(models=numbered, errors=errors)
        for name, version in sorted(version_repo.pinned(session)):
            active = numbered.get(name)
            if active is not None and active.version == str(version):
                continue
            row = version_repo.get(session, name, version)
            try:
                if row is None:
                    raise ArtifactError(f"model {name!r} has no version {version}")
                load_version(catalogue, row, store, loader=loader)
            except AppError as exc:
                log.error("model %s version %d not loaded: %s", name, version, exc.detail)
                errors[f"{name}@{version}"] = exc.detail
    return catalogue


def load_version(
    registry: ModelRegistry,
    row: ModelVersion,
    store: ArtifactStore | None,
    *,
    loader: ArtifactLoader = default_loader,
) -> RegisteredModel:
    """The version, loaded from the store (once: later calls find it in the registry)."""
    try:
        return registry.require(row.name, str(row.version))
    except AppError:
        pass
    if store is None or not store.has(row.artifact_sha256):
        raise ArtifactError(
            f"model {row.name!r} version {row.version}: its artifact is not in the store"
        )
    artifact = loader(store.path(row.artifact_sha256))
    model = register(artifact, name=row.name, loaded_at=datetime.now(UTC), version=row.version)
    if model.manifest_sha256 != row.artifact_sha256:
        raise ArtifactError(
            f"model {row.name!r} version {row.version}: its stored artifact was changed"
        )
    registry.add(model)
    return model
