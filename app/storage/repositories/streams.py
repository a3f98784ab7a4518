"""Streams: configuration and how far each one has got."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy import delete as sql_delete
from sqlalchemy import update as sql_update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from app.errors import ConflictError, DataError, NotFoundError
from app.registry import learned_name
from app.storage.models import ModelEntry, Stream


def get(session: Session, stream_id: str, *, for_update: bool = False) -> Stream | None:
    """The stream, or None. `for_update` locks its row until commit (PostgreSQL; SQLite
    serialises writers anyway), so two batches of one stream cannot interleave."""
    statement = select(Stream).where(Stream.id == stream_id)
    if for_update:
        statement = statement.with_for_update()
    return session.scalars(statement).one_or_none()


def require(session: Session, stream_id: str, *, for_update: bool = False) -> Stream:
    stream = get(session, stream_id, for_update=for_update)
    if stream is None:
        raise NotFoundError(f"stream {stream_id!r} does not exist", stream=stream_id)
    return stream


IDS_PER_QUERY = 10_000
"""Stream ids in one IN (...): PostgreSQL's driver takes at most 65,535 parameters a statement."""


def get_many(
    session: Session, stream_ids: Sequence[str], *, for_update: bool = False
) -> list[Stream]:
    """Those of the streams that exist, in key order (`for_update` locks them in that order:
    two requests never deadlock)."""
    ordered = sorted(set(stream_ids))
    found: list[Stream] = []
    for start in range(0, len(ordered), IDS_PER_QUERY):
        chunk = ordered[start : start + IDS_PER_QUERY]
        statement = select(Stream).where(Stream.id.in_(chunk)).order_by(Stream.id)
        if for_update:
            statement = statement.with_for_update()
        found += session.scalars(statement)
    return found


def require_many(
    session: Session, stream_ids: Sequence[str], *, for_update: bool = False
) -> list[Stream]:
    """The streams in the order asked; NotFoundError names the first missing one."""
    found = {stream.id: stream for stream in get_many(session, stream_ids, for_update=for_update)}
    for stream_id in stream_ids:
        if stream_id not in found:
            raise NotFoundError(f"stream {stream_id!r} does not exist", stream=stream_id)
    return [found[stream_id] for stream_id in stream_ids]


def page(
    session: Session, *, limit: int, cursor: str | None = None, prefix: str | None = None
) -> tuple[list[Stream], str | None]:
    """Streams in id order (those whose id starts with `prefix`), `limit` at a time after the
    one `cursor` names; the next page's cursor (None after the last)."""
    statement = select(Stream).order_by(Stream.id).limit(limit + 1)
    if prefix:
        statement = statement.where(Stream.id.startswith(prefix, autoescape=True))
    if cursor is not None:
        statement = statement.where(Stream.id > _decode_cursor(cursor))
    rows = list(session.scalars(statement))
    items = rows[:limit]
    more = len(rows) > limit
    return items, _encode_cursor(items[-1].id) if more else None


def _encode_cursor(stream_id: str) -> str:
    return base64.urlsafe_b64encode(stream_id.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    padded = (cursor + "=" * (-len(cursor) % 4)).encode()
    try:
        stream_id = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        stream_id = ""
    if not stream_id:
        raise DataError("invalid cursor: pass back the next_cursor of a previous page")
    return stream_id


def require_existing(session: Session, stream_ids: Sequence[str]) -> None:
    """NotFoundError naming the first of the streams that does not exist (their ids only are
    read: nothing of their rows is loaded)."""
    found: set[str] = set()
    ordered = sorted(set(stream_ids))
    for start in range(0, len(ordered), IDS_PER_QUERY):
        chunk = ordered[start : start + IDS_PER_QUERY]
        found.update(session.scalars(select(Stream.id).where(Stream.id.in_(chunk))))
    for stream_id in stream_ids:
        if stream_id not in found:
            raise NotFoundError(f"stream {stream_id!r} does not exist", stream=stream_id)


def all_ids(session: Session) -> list[str]:
    return list(session.scalars(select(Stream.id).order_by(Stream.id)))


def list_all(session: Session) -> list[Stream]:
    return list(session.scalars(select(Stream).order_by(Stream.id)))


@dataclass(frozen=True)
class NewStream:
    """A stream's row as its creation writes it (no readings yet)."""

    stream_id: str
    model_name: str
    channels: list[str]
    sample_period_s: float | None
    has_reference: bool
    detector_overrides: dict[str, Any]
    learning: dict[str, Any] | None = None
    false_alarms_per_day: float = 1.0


def create(session: Session, row: NewStream, *, now: datetime) -> Stream:
    """One stream, read back."""
    create_many(session, [row], now=now)
    stream = session.get(Stream, row.stream_id)
    assert stream is not None
    return stream


def create_many(session: Session, rows: Sequence[NewStream], *, now: datetime) -> None:
    """Insert the streams in one statement (a fleet's onboarding creates thousands);
    ConflictError if one exists already or names a model that is not registered."""
    if not rows:
        return
    values = [
        {
            "id": row.stream_id,
            "model_name": row.model_name,
            "channels": list(row.channels),
            "sample_period_s": row.sample_period_s,
            "has_reference": row.has_reference,
            "detector_overrides": dict(row.detector_overrides),
            "learning": None if row.learning is None else dict(row.learning),
            "false_alarms_per_day": row.false_alarms_per_day,
            "created_at": now,
            "updated_at": now,
            "last_t": None,
            "sample_count": 0,
        }
        for row in rows
    ]
    try:  # (the session is unusable after a failure: the caller's transaction rolls back)
        session.execute(insert(Stream), values)
    except IntegrityError:
        # Two creations raced (the other committed first), or the model is not registered.
        if len(rows) == 1:
            row = rows[0]
            raise ConflictError(
                f"stream {row.stream_id!r} could not be created: it was created concurrently "
                f"or model {row.model_name!r} is not registered; retry the request",
                stream=row.stream_id,
            ) from None
        raise ConflictError(
            f"{len(rows)} streams could not be created: one was created concurrently or names "
            "a model that is not registered; retry the request"
        ) from None


def update(
    session: Session,
    stream: Stream,
    *,
    model_name: str,
    channels: list[str],
    sample_period_s: float | None,
    has_reference: bool,
    detector_overrides: dict[str, Any],
    now: datetime,
    learning: dict[str, Any] | None = None,
    false_alarms_per_day: float = 1.0,
) -> Stream:
    if model_name != stream.model_name:
        stream.model_version = None  # the new model's active version
    stream.model_name = model_name
    stream.channels = list(channels)
    stream.sample_period_s = sample_period_s
    stream.has_reference = has_reference
    stream.detector_overrides = dict(detector_overrides)
    stream.learning = None if learning is None else dict(learning)
    stream.false_alarms_per_day = false_alarms_per_day
    stream.updated_at = now
    session.flush()
    return stream


# Built once and run on the session's connection: per ingest request, building the statement
# and the ORM's execution cost more than the UPDATE itself.
_ADVANCE = (
    sql_update(Stream)
    .where(Stream.id == bindparam("key"))
    .values(sample_count=bindparam("new_sample_count"), last_t=bindparam("new_last_t"))
)


def advance(
    session: Session, stream_id: str, *, sample_count: int, last_t: datetime | None
) -> None:
    """Record that the stream has accepted `sample_count` readings, the last one at `last_t`.

    One UPDATE by key, no SELECT first; raises NotFoundError if the stream is gone. A `Stream`
    the session holds is brought up to date too."""
    advance_many(session, [(stream_id, sample_count, last_t)])


def advance_many(session: Session, moves: Sequence[tuple[str, int, datetime | None]]) -> None:
    """`advance` for many streams at once (stream, reading count, last time): one executemany."""
    if not moves:
        return
    parameters = [
        {"key": stream_id, "new_sample_count": count, "new_last_t": last_t}
        for stream_id, count, last_t in moves
    ]
    result = session.connection().execute(_ADVANCE, parameters)
    if len(moves) == 1 and result.rowcount == 0:
        raise NotFoundError(f"no stream {moves[0][0]!r}", stream=moves[0][0])
    for stream_id, count, last_t in moves:
        held = session.identity_map.get(identity_key(Stream, stream_id))
        if held is not None:
            set_committed_value(held, "sample_count", count)
            set_committed_value(held, "last_t", last_t)


def delete(session: Session, stream_id: str) -> None:
    """Delete the stream with its alarms, checkpoint, readings and jobs (foreign-key cascade),
    and the models it learned (a stream made again under its id learns afresh)."""
    require(session, stream_id, for_update=True)
    session.execute(
        sql_delete(Stream).where(Stream.id == stream_id),
        execution_options={"synchronize_session": False},
    )
    session.execute(
        sql_delete(ModelEntry).where(ModelEntry.name == learned_name(stream_id)),
        execution_options={"synchronize_session": False},
    )
    # Objects of the deleted rows may still sit in the identity map: make them reload (and fail).
    session.expire_all()
