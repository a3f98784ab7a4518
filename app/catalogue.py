"""The model catalogue: every version of every model in the database (`model_versions`), its
artifact in the content-addressed store (`app/storage/artifact_store.py`), the loaded ones in
the registry (`app/registry.py`).

A stream of model "auto" has its own name, `auto.<stream id>`: its first fit is version 1, each
revision of its thresholds the next version, and its jobs' candidates versions beside them; the
artifact of such a version is the learned model's JSON (`learned.json`).

At start-up each models directory's artifact becomes a version of its name (the version that
already holds that artifact, or the next number) and the name's active version: what a stream
runs unless it names a version. The versions streams name (after a promotion or a rollback)
are loaded from the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.errors import AppError, ArtifactError
from app.learning.learn import LearnedModel
from app.monitoring.config import MonitorConfig
from app.registry import (
    AUTO,
    ArtifactLoader,
    ModelRegistry,
    RegisteredModel,
    default_loader,
    learned_name,
    register,
)
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.models import ModelVersion, Stream
from app.storage.repositories import learned as learned_repo
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
        if store is not None:
            version_unversioned(session, store, now=now)
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


LEARNED = "learned"
"""The kind of a version a stream learned."""
LEARNED_FILE = "learned.json"


def store_learned(store: ArtifactStore | None, learned: LearnedModel) -> str:
    """The learned model's artifact hash, its directory put in the store."""
    if store is None:
        raise ArtifactError("no artifact store: the versions streams learn cannot be kept")
    data = json.dumps(learned.to_json(), sort_keys=True).encode()
    sha = hashlib.sha256(data).hexdigest()
    if not store.reuse(sha):
        scratch = Path(tempfile.mkdtemp(prefix="twinwatch-learned-"))
        try:
            (scratch / LEARNED_FILE).write_bytes(data)
            store.put(scratch, sha)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return sha


def load_learned(store: ArtifactStore | None, row: ModelVersion) -> LearnedModel:
    """A learned version's model, from the store."""
    if store is None or not store.has(row.artifact_sha256):
        raise ArtifactError(
            f"model {row.name!r} version {row.version}: its artifact is not in the store"
        )
    data = (store.path(row.artifact_sha256) / LEARNED_FILE).read_bytes()
    if hashlib.sha256(data).hexdigest() != row.artifact_sha256:
        raise ArtifactError(
            f"model {row.name!r} version {row.version}: its stored artifact was changed"
        )
    return LearnedModel.from_json(json.loads(data))


def learned_version(
    session: Session,
    store: ArtifactStore | None,
    *,
    stream_id: str,
    channels: list[str],
    learned: LearnedModel,
    source: dict[str, Any],
    created_by: str,
    now: datetime,
    status: str = "candidate",
) -> ModelVersion:
    """A new version of the stream's learned models; an `active` one becomes what the stream
    runs (the one it ran before retires)."""
    name = learned_name(stream_id)
    sha = store_learned(store, learned)
    if model_entries.get(session, name) is None:
        model_entries.upsert(
            session,
            name=name,
            version="0",
            kind=LEARNED,
            manifest_sha256=sha,
            config={"kind": LEARNED, "stream": stream_id},
            metrics={},
            thresholds={},
            loaded_at=now,
        )
    row = version_repo.create(
        session,
        name=name,
        artifact_sha256=sha,
        source=source,
        **learned_fields(learned, channels),
        created_by=created_by,
        now=now,
        status=status,
    )
    if status == "active":
        activate(session, row)
    return row


def learned_fields(learned: LearnedModel, channels: list[str]) -> dict[str, Any]:
    """What a learned version's row says of it: its kind, each channel's model and error, its
    detectors' thresholds and how they were set."""
    return {
        "kind": LEARNED,
        "metrics": {"channels": learned.summary(channels)},
        "thresholds": learned.monitor.model_dump(mode="json"),
        "calibration": {
            **(learned.monitor.calibration or {}),
            "method": "learned",
            "false_alarms_per_day": learned.false_alarms_per_day,
            "readings": learned.readings,
        },
    }


def version_unversioned(session: Session, store: ArtifactStore, *, now: datetime) -> int:
    """Streams that learned before the catalogue kept learned versions: their first fit becomes
    version 1 of their learned models, each revision since the next. Returns how many."""
    made = 0
    for stream, row in learned_repo.unversioned(session):
        assert row.model is not None
        learned = LearnedModel.from_json(row.model)
        first_fit(session, store, stream, learned, row.learned_from, now=now)
        for revised in row.revisions:
            monitor = MonitorConfig.model_validate(revised["monitor"])
            revision(session, store, stream, learned, monitor, revised["from_sample"], now=now)
        made += 1
    if made:
        log.info("%d learned stream(s) now run versions of their learned models", made)
    return made


def first_fit(
    session: Session,
    store: ArtifactStore | None,
    stream: Stream,
    learned: LearnedModel,
    readings: int,
    *,
    now: datetime,
) -> ModelVersion:
    """What a stream learned from its first `readings` readings: version 1 of its learned
    models (the next one if it learned before under its id), which it runs from now on."""
    row = learned_version(
        session,
        store,
        stream_id=stream.id,
        channels=list(stream.channels),
        learned=learned,
        source={"stream": stream.id, "first_sample": 0, "readings": readings},
        created_by="learning",
        now=now,
        status="active",
    )
    stream.model_version = row.version
    return row


def revision(
    session: Session,
    store: ArtifactStore | None,
    stream: Stream,
    learned: LearnedModel,
    monitor: MonitorConfig,
    from_sample: int,
    *,
    now: datetime,
) -> ModelVersion:
    """A revision of a learned stream's thresholds (`monitor`, from sample `from_sample` on):
    the next version of its learned models, which it runs from now on."""
    row = learned_version(
        session,
        store,
        stream_id=stream.id,
        channels=list(stream.channels),
        learned=replace(learned, monitor=monitor),
        source={"stream": stream.id, "from_sample": from_sample},
        created_by="revision",
        now=now,
        status="active",
    )
    stream.model_version = row.version
    return row


RETIRED_KEPT = 10
"""Versions of a stream's learned models kept once they no longer run, the newest first: its
threshold revisions and relearnings would otherwise pile up for ever."""


def prune(session: Session, name: str, *, kept: int, keep: set[int]) -> list[str]:
    """Delete the retired versions of `name` beyond the newest `kept` (never those in `keep`:
    a rollback's target), in `session`'s transaction. Returns the artifacts no version refers
    to any more: the caller removes them once the transaction has committed."""
    retired = [
        row
        for row in reversed(version_repo.list_for(session, name))
        if row.status == "retired" and row.version not in keep
    ]
    doomed = retired[kept:]
    if not doomed:
        return []
    for row in doomed:
        session.delete(row)
    session.flush()
    shas = {row.artifact_sha256 for row in doomed}
    return sorted(shas - version_repo.artifacts_in_use(session, shas))


ORPHAN_AGE_S = 3600.0
"""An artifact is put in the store moments before the version that names it is committed (by a
job, or a model loaded at start-up, in any service sharing the store); one that nothing names
an hour later never will be: a job that failed or was cancelled after storing it."""


def orphans(database: Database, store: ArtifactStore, *, batch: int = 1000) -> list[str]:
    """The stored artifacts no version and no loaded model refers to, older than
    `ORPHAN_AGE_S`: the caller removes them."""
    found: list[str] = []
    shas = list(store.older_than(ORPHAN_AGE_S))
    for start in range(0, len(shas), batch):
        chunk = set(shas[start : start + batch])
        with database.session() as session:
            found += sorted(chunk - version_repo.artifacts_in_use(session, chunk))
    return found


def activate(session: Session, row: ModelVersion) -> None:
    """Make the version its name's active one: what runs (a learned one: on its stream)."""
    entry = model_entries.get(session, row.name)
    assert entry is not None
    entry.active_version = row.version
    entry.version = str(row.version)
    entry.manifest_sha256 = row.artifact_sha256
    entry.thresholds = row.thresholds
    entry.metrics = row.metrics
    version_repo.refresh_statuses(session, row.name)
