"""Stream checkpoints: the engine's serialised state, one row per stream."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete as sql_delete
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from app.storage.models import StreamCheckpoint


def get(session: Session, stream_id: str) -> StreamCheckpoint | None:
    return session.get(StreamCheckpoint, stream_id)


@dataclass(frozen=True)
class Saved:
    """One stream's checkpoint as written: its state after `sample_count` readings."""

    stream_id: str
    sample_count: int
    last_t: datetime | None
    state: bytes
    state_version: int


def save(session: Session, rows: Sequence[Saved], *, now: datetime) -> None:
    """Replace the streams' checkpoints (insert those that have none): one upsert of every row,
    as a stop writes thousands. Checkpoints the session holds are brought up to date too."""
    if not rows:
        return
    values = [
        {
            "stream_id": row.stream_id,
            "sample_count": row.sample_count,
            "last_t": row.last_t,
            "state": row.state,
            "state_version": row.state_version,
            "updated_at": now,
        }
        for row in rows
    ]
    upsert = (
        postgresql_insert(StreamCheckpoint)
        if session.get_bind().dialect.name == "postgresql"
        else sqlite_insert(StreamCheckpoint)
    )
    statement = upsert.on_conflict_do_update(
        index_elements=[StreamCheckpoint.stream_id],
        set_={name: getattr(upsert.excluded, name) for name in _CHANGED},
    )
    session.connection().execute(statement, values)
    for row in values:
        held = session.identity_map.get(identity_key(StreamCheckpoint, row["stream_id"]))
        if held is not None:
            for name in _CHANGED:
                set_committed_value(held, name, row[name])


_CHANGED = ("sample_count", "last_t", "state", "state_version", "updated_at")


def delete(session: Session, stream_id: str) -> None:
    """Drop the stream's checkpoint: it is restored from its first reading next time."""
    session.execute(
        sql_delete(StreamCheckpoint).where(StreamCheckpoint.stream_id == stream_id),
        execution_options={"synchronize_session": "fetch"},
    )


def get_many(session: Session, stream_ids: Sequence[str]) -> dict[str, StreamCheckpoint]:
    """The checkpoints of those of the streams that have one, by stream."""
    statement = select(StreamCheckpoint).where(StreamCheckpoint.stream_id.in_(stream_ids))
    return {row.stream_id: row for row in session.scalars(statement)}
