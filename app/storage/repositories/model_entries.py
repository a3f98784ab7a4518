"""The model registry table: what was loaded, which version, with which thresholds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.storage.models import ModelEntry


def get(session: Session, name: str) -> ModelEntry | None:
    return session.get(ModelEntry, name)


def list_all(session: Session) -> list[ModelEntry]:
    return list(session.scalars(select(ModelEntry).order_by(ModelEntry.name)))


def upsert(
    session: Session,
    *,
    name: str,
    version: str,
    kind: str,
    manifest_sha256: str,
    config: dict[str, Any],
    metrics: dict[str, Any],
    thresholds: dict[str, Any],
    loaded_at: datetime,
) -> ModelEntry:
    """Insert or refresh the entry of `name` (one row per name: the version loaded last)."""
    entry = session.get(ModelEntry, name, with_for_update=True)
    if entry is None:
        entry = ModelEntry(name=name)
        session.add(entry)
    entry.version = version
    entry.kind = kind
    entry.manifest_sha256 = manifest_sha256
    entry.config = config
    entry.metrics = metrics
    entry.thresholds = thresholds
    entry.loaded_at = loaded_at
    session.flush()
    return entry
