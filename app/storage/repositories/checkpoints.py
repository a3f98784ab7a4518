"""Stream checkpoints: the engine's serialised state, one row per stream."""

from __future__ import annotations

from datetime import datetime

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
) -> StreamCheckpoint:
    """Replace the stream's checkpoint with the state after `sample_count` readings."""
    checkpoint = session.get(StreamCheckpoint, stream_id)
    if checkpoint is None:
        checkpoint = StreamCheckpoint(stream_id=stream_id)
        session.add(checkpoint)
    checkpoint.sample_count = sample_count
    checkpoint.last_t = last_t
    checkpoint.state = state
    checkpoint.state_version = state_version
    checkpoint.updated_at = now
    session.flush()
    return checkpoint
