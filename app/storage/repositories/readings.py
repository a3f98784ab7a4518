"""Accepted readings: the idempotency key (stream, t) and the record to rebuild state from."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import CursorResult, func, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from app.storage.models import Reading

# Bound parameters per IN (...) query: far below SQLite's 32,766 and cheap for PostgreSQL.
_IN_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class NewReading:
    """One reading to store: `sample` is the stream's running index, `t` timezone-aware UTC,
    `batch` the sample of the first reading of the request that brought it."""

    stream_id: str
    sample: int
    t: datetime
    value: float | None
    values: dict[str, float | None] | None = None
    reference: float | None = None
    batch: int | None = None


def insert_many(session: Session, readings: Sequence[NewReading]) -> int:
    """Insert `readings` (of any streams), skipping any whose (stream, t) or (stream, sample) is
    already stored.

    Returns how many rows were inserted, so a caller that checked for duplicates first can tell
    that a concurrent writer got there in between. One statement on PostgreSQL (arrays unnested
    server-side: about twice as fast as a multi-row VALUES with RETURNING), one executemany on
    SQLite.
    """
    if not readings:
        return 0
    for reading in readings:
        if reading.t.tzinfo is None or reading.t.utcoffset() is None:
            raise ValueError(f"naive datetime {reading.t!r}: give a timezone-aware UTC time")
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return _insert_unnest(session, readings)
    if dialect != "sqlite":
        raise NotImplementedError(f"readings.insert_many does not support {dialect}")
    rows = [
        {
            "stream_id": reading.stream_id,
            "sample": reading.sample,
            "batch": reading.batch,
            "t": reading.t,
            "value": reading.value,
            "values": reading.values,
            "reference": reading.reference,
        }
        for reading in readings
    ]
    table = Reading.metadata.tables[Reading.__tablename__]
    # A plain executemany: the driver's rowcount counts the rows inserted, which is all the
    # caller needs (RETURNING would turn the batch into row-by-row fetching).
    result = session.execute(sqlite.insert(table).on_conflict_do_nothing(), rows)
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


_UNNEST_INSERT = text(
    f"""
    INSERT INTO {Reading.__tablename__}
        (stream_id, sample, batch, t, value, "values", reference)
    SELECT u.stream_id, u.sample, u.batch, u.t, u.value, CAST(u.channel_values AS json),
        u.reference
    FROM unnest(
        CAST(:stream_ids AS text[]),
        CAST(:samples AS bigint[]),
        CAST(:batches AS bigint[]),
        CAST(:times AS timestamptz[]),
        CAST(:values AS double precision[]),
        CAST(:channel_values AS text[]),
        CAST(:references AS double precision[])
    ) AS u(stream_id, sample, batch, t, value, channel_values, reference)
    ON CONFLICT DO NOTHING
    """
)


def _insert_unnest(session: Session, readings: Sequence[NewReading]) -> int:
    parameters = {
        "stream_ids": [reading.stream_id for reading in readings],
        "samples": [reading.sample for reading in readings],
        "batches": [reading.batch for reading in readings],
        "times": [reading.t for reading in readings],
        "values": [reading.value for reading in readings],
        "channel_values": [
            None if reading.values is None else json.dumps(reading.values, allow_nan=False)
            for reading in readings
        ],
        "references": [reading.reference for reading in readings],
    }
    result = session.execute(_UNNEST_INSERT, parameters)
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


def existing_at(
    session: Session, *, stream_id: str, times: Iterable[datetime]
) -> dict[datetime, Reading]:
    """The stored readings of the stream at any of `times`, keyed by their time."""
    wanted = sorted(set(times))
    found: dict[datetime, Reading] = {}
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start : start + _IN_CHUNK]
        statement = select(Reading).where(Reading.stream_id == stream_id, Reading.t.in_(chunk))
        for reading in session.scalars(statement):
            found[reading.t] = reading
    return found


def by_sample(
    session: Session, *, stream_id: str, start: int = 0, stop: int | None = None
) -> list[Reading]:
    """The stream's readings with `start <= sample < stop`, oldest first."""
    statement = select(Reading).where(Reading.stream_id == stream_id, Reading.sample >= start)
    if stop is not None:
        statement = statement.where(Reading.sample < stop)
    return list(session.scalars(statement.order_by(Reading.sample)))


def tail(session: Session, *, stream_id: str, limit: int) -> list[Reading]:
    """The stream's last `limit` readings, oldest first (a window to re-warm from)."""
    statement = (
        select(Reading)
        .where(Reading.stream_id == stream_id)
        .order_by(Reading.sample.desc())
        .limit(limit)
    )
    return list(reversed(list(session.scalars(statement))))


def any_for(session: Session, *, stream_id: str) -> bool:
    """Whether the stream has accepted any reading."""
    statement = select(Reading.sample).where(Reading.stream_id == stream_id).limit(1)
    return session.scalar(statement) is not None


def count(session: Session, *, stream_id: str) -> int:
    statement = select(func.count()).select_from(Reading).where(Reading.stream_id == stream_id)
    return int(session.scalar(statement) or 0)
