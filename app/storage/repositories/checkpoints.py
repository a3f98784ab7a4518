"""Stream checkpoints: the engine's serialised state, one row per stream."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.storage.models import StreamCheckpoint


def get(session: Session, stream_id: str) -> StreamCheckpoint | None:
    return session.get(StreamCheckpoint, stream_id)


def save(
    session: Session,
    *,
    stream_id: str,
    sample_count: int,
    last_t: datetime | None,
    state: bytes,
    state_version: int,
    now: datetime,
) -> None:
    """Replace the stream's checkpoint with the state after `sample_count` readings.

    One UPDATE in the common case (the row exists), an INSERT for a stream's first batch."""
    updated = session.execute(
        update(StreamCheckpoint)
        .where(StreamCheckpoint.stream_id == stream_id)
        .values(
            sample_count=sample_count,
            last_t=last_t,
            state=state,
            state_version=state_version,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    if getattr(updated, "rowcount", 0) == 1:
        return
    session.add(
        StreamCheckpoint(
            stream_id=stream_id,
            sample_count=sample_count,
            last_t=last_t,
            state=state,
            state_version=state_version,
            updated_at=now,
        )
    )
    session.flush()
