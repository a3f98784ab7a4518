"""Model versions (`model_versions`): numbered per name, with their status kept in step with
what runs them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.errors import NotFoundError
from app.registry import AUTO
from app.storage.models import ModelEntry, ModelSwitch, ModelVersion, Shadow, Stream


def get(session: Session, name: str, version: int) -> ModelVersion | None:
    return session.get(ModelVersion, (name, version))


def require(session: Session, name: str, version: int) -> ModelVersion:
    row = get(session, name, version)
    if row is None:
        raise NotFoundError(f"model {name!r} has no version {version}", model=name)
    return row


def list_for(session: Session, name: str) -> list[ModelVersion]:
    statement = select(ModelVersion).where(ModelVersion.name == name)
    return list(session.scalars(statement.order_by(ModelVersion.version)))


def counts(session: Session) -> dict[str, int]:
    """How many versions each name has."""
    statement = select(ModelVersion.name, func.count()).group_by(ModelVersion.name)
    return {name: int(count) for name, count in session.execute(statement)}


def with_artifact(session: Session, name: str, artifact_sha256: str) -> ModelVersion | None:
    """The name's newest version holding that artifact."""
    statement = (
        select(ModelVersion)
        .where(ModelVersion.name == name, ModelVersion.artifact_sha256 == artifact_sha256)
        .order_by(ModelVersion.version.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def create(
    session: Session,
    *,
    name: str,
    kind: str,
    artifact_sha256: str,
    source: dict[str, Any],
    metrics: dict[str, Any],
    thresholds: dict[str, Any],
    calibration: dict[str, Any],
    created_by: str,
    now: datetime,
    status: str = "candidate",
) -> ModelVersion:
    """The name's next version. Its entry row is locked meanwhile (PostgreSQL; SQLite
    serialises writers): two creations never take the same number."""
    session.get(ModelEntry, name, with_for_update=True)
    newest = session.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.name == name))
    row = ModelVersion(
        name=name,
        version=(newest or 0) + 1,
        kind=kind,
        artifact_sha256=artifact_sha256,
        source=source,
        metrics=metrics,
        thresholds=thresholds,
        calibration=calibration,
        created_by=created_by,
        created_at=now,
        status=status,
    )
    session.add(row)
    session.flush()
    return row


def run_by(session: Session, stream: Stream) -> int | None:
    """The version a stream of a trained model runs: the one it names, else its model's
    active one (None if its model has none)."""
    if stream.model_version is not None:
        return stream.model_version
    entry = session.get(ModelEntry, stream.model_name)
    return None if entry is None else entry.active_version


def in_use(session: Session, name: str) -> set[int]:
    """The versions of `name` that run: its active one and those streams name."""
    entry = session.get(ModelEntry, name)
    active = None if entry is None else entry.active_version
    statement = select(Stream.model_version).where(Stream.model_name == name).distinct()
    used = {active if version is None else version for version in session.scalars(statement)}
    if active is not None:
        used.add(active)
    return {version for version in used if version is not None}


def artifacts_in_use(session: Session, shas: set[str]) -> set[str]:
    """Those of the artifacts some version, or a model the service loaded, refers to."""
    versions = select(ModelVersion.artifact_sha256).where(ModelVersion.artifact_sha256.in_(shas))
    loaded = select(ModelEntry.manifest_sha256).where(ModelEntry.manifest_sha256.in_(shas))
    return set(session.scalars(versions)) | set(session.scalars(loaded))


def refresh_statuses(session: Session, name: str) -> None:
    """`active` for the versions that run, `retired` for those that ran and no longer do;
    candidates stay candidates until a stream runs them."""
    used = in_use(session, name)
    for row in list_for(session, name):
        if row.version in used:
            row.status = "active"
        elif row.status == "active":
            row.status = "retired"
    session.flush()


def pinned(session: Session) -> set[tuple[str, int]]:
    """The (trained model, version) pairs streams name explicitly (a stream of model "auto"
    names its learned version)."""
    statement = (
        select(Stream.model_name, Stream.model_version)
        .where(Stream.model_version.is_not(None), Stream.model_name != AUTO)
        .distinct()
    )
    return {(name, version) for name, version in session.execute(statement) if version is not None}


def record_switch(
    session: Session,
    *,
    stream_id: str,
    at_sample: int,
    previous: tuple[str, str],
    model: tuple[str, int],
    now: datetime,
    reason: str | None = None,
) -> ModelSwitch:
    row = ModelSwitch(
        reason=None if reason is None else reason[:500],
        stream_id=stream_id,
        at_sample=at_sample,
        from_model=previous[0],
        from_version=previous[1],
        to_model=model[0],
        to_version=model[1],
        switched_at=now,
    )
    session.add(row)
    session.flush()
    return row


def last_switch(session: Session, stream_id: str) -> ModelSwitch | None:
    """The stream's latest switch (what a rollback undoes)."""
    statement = (
        select(ModelSwitch)
        .where(ModelSwitch.stream_id == stream_id)
        .order_by(ModelSwitch.id.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def shadow_of(session: Session, stream_id: str) -> Shadow | None:
    return session.get(Shadow, stream_id)


def set_shadow(
    session: Session, *, stream_id: str, model: tuple[str, int], from_sample: int, now: datetime
) -> Shadow:
    """The stream's shadow (one at most: a new one replaces it)."""
    row = session.get(Shadow, stream_id)
    if row is None:
        row = Shadow(stream_id=stream_id)
        session.add(row)
    row.model_name, row.model_version = model
    row.from_sample, row.started_at = from_sample, now
    session.flush()
    return row


RELEARNED = "(relearn)"
"""How a version a relearning job made ends its `created_by` ("job 12 (relearn)")."""


def relearned_shadow(session: Session, stream_id: str) -> Shadow | None:
    """The stream's shadow if it is a candidate a relearning made (not one a user put)."""
    shadow = session.get(Shadow, stream_id)
    if shadow is None:
        return None
    row = get(session, shadow.model_name, shadow.model_version)
    return shadow if row is not None and row.created_by.endswith(RELEARNED) else None


def end_shadow(session: Session, stream_id: str) -> bool:
    row = session.get(Shadow, stream_id)
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True
