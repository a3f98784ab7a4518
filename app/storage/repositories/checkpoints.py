"""Stream checkpoints: the engine's serialised state, one row per stream."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import bindparam, select, update
from sqlalchemy import delete as sql_delete
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from app.storage.models import StreamCheckpoint


def get(session: Session, stream_id: str) -> StreamCheckpoint | None:
    return session.get(StreamCheckpoint, stream_id)


# Built once and run on the session's connection: building the statement and the ORM's
# execution cost more than the UPDATE itself.
_UPDATE = (
    update(StreamCheckpoint)
    .where(StreamCheckpoint.stream_id == bindparam("key"))
    .values(
        sample_count=bindparam("new_sample_count"),
        last_t=bindparam("new_last_t"),
        state=bindparam("new_state"),
        state_version=bindparam("new_state_version"),
        updated_at=bindparam("new_updated_at"),
    )
)


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
    values = {
        "sample_count": sample_count,
        "last_t": last_t,
        "state": state,
        "state_version": state_version,
        "updated_at": now,
    }
    parameters = {f"new_{name}": value for name, value in values.items()}
    if session.connection().execute(_UPDATE, {"key": stream_id, **parameters}).rowcount == 1:
        held = session.identity_map.get(identity_key(StreamCheckpoint, stream_id))
        if held is not None:
            for name, value in values.items():
                set_committed_value(held, name, value)
        return
    session.add(StreamCheckpoint(stream_id=stream_id, **values))
    session.flush()


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
