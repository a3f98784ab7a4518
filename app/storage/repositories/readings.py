"""Accepted readings, packed one row per batch: what a restart replays and re-sends are checked
against (the row layout is documented on `ReadingBatch`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
from pydantic_core import TzInfo
from sqlalchemy import CursorResult, Row, delete, func, select, text
from sqlalchemy.orm import Session

from app.storage.models import ReadingBatch, StreamCheckpoint

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_FIXED_ZONES = (timezone, TzInfo)  # what pydantic and datetime.UTC give; not DST zones
_TIMES = np.dtype("<i8")
_NUMBERS = np.dtype("<f8")
SMALL_BATCH = 64
"""Rows of fewer readings are packed together once a checkpoint has passed them (`pack`): a
gateway's tick brings one reading a stream, and a row costs a hundred bytes or more beside
its reading's sixteen or twenty-four."""
PACKED_READINGS = 4096
"""The most readings `pack` puts in one row."""


def micros(times: Sequence[datetime]) -> np.ndarray:
    """Timezone-aware datetimes as int64 microseconds since the Unix epoch (exact)."""
    zone = times[0].tzinfo if times else None
    epoch = EPOCH
    if type(zone) in _FIXED_ZONES:
        # In the first time's fixed-offset zone (a request's parsed times share one): Python
        # subtracts times of the same tzinfo without asking it for their offsets. A time in
        # another zone is subtracted with offsets, as from EPOCH: exact too.
        epoch = EPOCH.astimezone(zone)
    try:
        return np.array([(t - epoch) // _MICROSECOND for t in times], dtype=np.int64)
    except TypeError:
        naive = next(t for t in times if t.tzinfo is None or t.utcoffset() is None)
        raise ValueError(f"naive datetime {naive!r}: give a timezone-aware UTC time") from None


def micro(t: datetime) -> int:
    """One timezone-aware datetime as `micros` gives it."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"naive datetime {t!r}: give a timezone-aware UTC time")
    return (t - EPOCH) // _MICROSECOND


def datetime_at(micro: int) -> datetime:
    """The inverse of `micros` for one time: a timezone-aware UTC datetime."""
    return EPOCH + timedelta(microseconds=micro)


@dataclass(slots=True)  # (not frozen: one is made per stream and request, and frozen costs more)
class NewBatch:
    """One stream's readings of one request: `micros` (N,) from `micros()`, `values` (N, C) in
    the stream's channel order and `references` (N,) or None, NaN where a number is missing."""

    stream_id: str
    first_sample: int
    micros: np.ndarray
    values: np.ndarray
    references: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class StoredBatch:
    first_sample: int
    micros: np.ndarray  # (N,) int64
    values: np.ndarray  # (N, C) float64
    references: np.ndarray | None  # (N,) float64

    @property
    def stop(self) -> int:
        """The sample after the batch's last."""
        return self.first_sample + len(self.micros)

    @property
    def last_t(self) -> datetime:
        return datetime_at(int(self.micros[-1]))

    @property
    def references_or_nan(self) -> np.ndarray:
        """The references, NaN where (or, for a batch without any, wherever) there is none."""
        if self.references is None:
            return np.full(len(self.micros), np.nan)
        return self.references


@dataclass(frozen=True, slots=True)
class StoredReading:
    """One reading of a stored batch, as re-sends are compared with it."""

    sample: int
    values: np.ndarray  # (C,), NaN for a missing number
    reference: float | None


def insert_batches(session: Session, batches: Sequence[NewBatch]) -> int:
    """Insert the batches (of any streams), skipping any whose (stream, first sample) is already
    stored.

    Returns how many were inserted, so a caller can tell that a concurrent writer claimed the
    same samples. One executemany on SQLite, one statement of arrays unnested server-side on
    PostgreSQL (a round trip per row would cost more than the rows).
    """
    batches = [batch for batch in batches if len(batch.micros)]
    if not batches:
        return 0
    for batch in batches:
        _check(batch)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return _insert_unnest(session, batches)
    if dialect != "sqlite":
        raise NotImplementedError(f"readings.insert_batches does not support {dialect}")
    # The DB-API's executemany on ready-made tuples: SQLAlchemy's per-row parameter processing
    # costs more than the insert.
    sqlite_rows = [
        (*row[:3], sqlite_time(datetime_at(row[3])), sqlite_time(datetime_at(row[4])), *row[5:])
        for row in map(_row, batches)
    ]
    result = session.connection().exec_driver_sql(_SQLITE_INSERT, sqlite_rows)
    return int(result.rowcount)


# (stream, first sample, count, first and last time in microseconds, the three arrays)
_Row = tuple[str, int, int, int, int, bytes, bytes, bytes | None]


def _check(batch: NewBatch) -> None:
    count = len(batch.micros)
    if batch.values.ndim != 2 or batch.values.shape[0] != count:
        raise ValueError(f"values of shape {batch.values.shape} for {count} readings")
    if batch.references is not None and batch.references.shape != (count,):
        raise ValueError(f"references of shape {batch.references.shape} for {count} readings")


def _row(batch: NewBatch) -> _Row:
    count = len(batch.micros)
    return (
        batch.stream_id,
        batch.first_sample,
        count,
        int(batch.micros[0]),
        int(batch.micros[-1]),
        batch.micros.astype(_TIMES, copy=False).tobytes(),
        batch.values.astype(_NUMBERS, copy=False).tobytes(),
        None if batch.references is None else batch.references.astype(_NUMBERS).tobytes(),
    )


_COLUMNS = (
    "stream_id, first_sample, count, first_t, last_t, times, channel_values, reference_values"
)
_SQLITE_INSERT = (
    f"INSERT INTO {ReadingBatch.__tablename__} ({_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def sqlite_time(t: datetime) -> str:
    """A time as SQLAlchemy stores a `UTCDateTime` in SQLite (naive UTC, microseconds), in a
    fraction of the time its bind processors take (a test pins that the two agree)."""
    return t.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


_UNNEST_INSERT = text(
    f"""
    INSERT INTO {ReadingBatch.__tablename__} ({_COLUMNS})
    SELECT u.stream_id, u.first_sample, u.count,
        TIMESTAMPTZ 'epoch' + u.first_us * INTERVAL '1 microsecond',
        TIMESTAMPTZ 'epoch' + u.last_us * INTERVAL '1 microsecond',
        u.times, u.channel_values, u.reference_values
    FROM unnest(
        CAST(CAST(:stream_ids AS text) AS text[]),
        CAST(CAST(:first_samples AS text) AS bigint[]),
        CAST(CAST(:counts AS text) AS integer[]),
        CAST(CAST(:first_micros AS text) AS bigint[]),
        CAST(CAST(:last_micros AS text) AS bigint[]),
        CAST(CAST(:times AS text) AS bytea[]),
        CAST(CAST(:channel_values AS text) AS bytea[]),
        CAST(CAST(:reference_values AS text) AS bytea[])
    ) AS u(stream_id, first_sample, count, first_us, last_us, times, channel_values,
        reference_values)
    ON CONFLICT DO NOTHING
    """
)


def _insert_unnest(session: Session, batches: list[NewBatch]) -> int:
    # Arrays go as PostgreSQL array literals, each built from one numpy conversion and one
    # join: psycopg's list dumpers, or a conversion per batch, cost more for the many
    # one-reading batches of a gateway's tick.
    counts = [len(batch.micros) for batch in batches]
    times = np.concatenate([batch.micros for batch in batches]).astype(_TIMES)
    ends = np.cumsum(counts)
    parameters = {
        "stream_ids": _array([_quoted(batch.stream_id) for batch in batches]),
        "first_samples": _array([str(batch.first_sample) for batch in batches]),
        "counts": _array(list(map(str, counts))),
        "first_micros": _array(list(map(str, times[ends - counts].tolist()))),
        "last_micros": _array(list(map(str, times[ends - 1].tolist()))),
        "times": _hex_array(times.tobytes().hex(), counts, 16),
        "channel_values": _hex_blobs([batch.values for batch in batches]),
        "reference_values": _hex_blobs([batch.references for batch in batches]),
    }
    result = session.execute(_UNNEST_INSERT, parameters)
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


def _hex_blobs(arrays: list[np.ndarray | None]) -> str:
    """bytea array literal of float64 arrays (NULL for None), from one hex conversion."""
    present = [array for array in arrays if array is not None]
    if not present:
        return _array(["NULL"] * len(arrays))
    if len(present) != len(arrays):  # mixed: rare (streams with and without references)
        return _array([_hex(None if a is None else a.astype(_NUMBERS).tobytes()) for a in arrays])
    digits = np.concatenate([array.ravel() for array in present]).astype(_NUMBERS).tobytes().hex()
    return _hex_array(digits, [array.size for array in present], 16)


def _hex_array(digits: str, sizes: list[int], width: int) -> str:
    """bytea array literal of consecutive blobs of `sizes` items of `width` hex digits each."""
    parts = []
    start = 0
    for size in sizes:
        stop = start + size * width
        parts.append(digits[start:stop])
        start = stop
    return '{"\\\\x' + '","\\\\x'.join(parts) + '"}'


def _array(items: list[str]) -> str:
    return "{" + ",".join(items) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _hex(blob: bytes | None) -> str:
    """bytea's hex input form inside an array literal (its backslash escaped)."""
    return "NULL" if blob is None else '"\\\\x' + blob.hex() + '"'


def _stored(row: ReadingBatch | Row[Any]) -> StoredBatch:
    times = np.frombuffer(row.times, dtype=_TIMES).astype(np.int64)
    values = np.frombuffer(row.channel_values, dtype=_NUMBERS).astype(np.float64)
    references = row.reference_values
    return StoredBatch(
        first_sample=row.first_sample,
        micros=times,
        values=values.reshape(len(times), -1),
        references=None
        if references is None
        else np.frombuffer(references, dtype=_NUMBERS).astype(np.float64),
    )


def pack(session: Session, *, stream_id: str, before_sample: int) -> int:
    """Merge the stream's runs of small rows (fewer than `SMALL_BATCH` readings each) that end
    by `before_sample` into rows of at most `PACKED_READINGS`. Called with the checkpoint at
    `before_sample`: a restart replays only the rows from there on, which stay as they are, and
    re-sends find their readings by time in a packed row as in the rows it replaced. Returns
    how many rows it removed."""
    table = ReadingBatch.__table__  # rows, not ORM objects: nothing of the session to expire
    statement = (
        select(table)
        .where(
            ReadingBatch.stream_id == stream_id,
            ReadingBatch.count < SMALL_BATCH,
            ReadingBatch.first_sample + ReadingBatch.count <= before_sample,
        )
        .order_by(ReadingBatch.first_sample)
    )
    runs: list[list[StoredBatch]] = []
    for row in session.execute(statement):
        batch = _stored(row)
        run = runs[-1] if runs else None
        if (
            run is not None
            and run[-1].stop == batch.first_sample
            and sum(len(b.micros) for b in run) + len(batch.micros) <= PACKED_READINGS
        ):
            run.append(batch)
        else:
            runs.append([batch])
    removed = 0
    merged = []
    for run in runs:
        if len(run) < 2:
            continue
        starts = [batch.first_sample for batch in run]
        session.execute(
            delete(ReadingBatch)
            .where(ReadingBatch.stream_id == stream_id, ReadingBatch.first_sample.in_(starts))
            .execution_options(synchronize_session=False)
        )
        removed += len(run)
        with_references = any(batch.references is not None for batch in run)
        merged.append(
            NewBatch(
                stream_id=stream_id,
                first_sample=run[0].first_sample,
                micros=np.concatenate([batch.micros for batch in run]),
                values=np.concatenate([batch.values for batch in run]),
                references=np.concatenate([b.references_or_nan for b in run])
                if with_references
                else None,
            )
        )
    if merged:
        insert_batches(session, merged)
    return removed


def prune(session: Session, *, stream_id: str, before_sample: int, before: datetime) -> int:
    """Delete the stream's rows that end by `before_sample` (its checkpoint: a restart replays
    nothing before it) and whose last reading is older than `before`. Returns how many."""
    result = session.execute(
        delete(ReadingBatch)
        .where(
            ReadingBatch.stream_id == stream_id,
            ReadingBatch.first_sample + ReadingBatch.count <= before_sample,
            ReadingBatch.last_t < before,
        )
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def batches_from(session: Session, *, stream_id: str, first_sample: int = 0) -> list[StoredBatch]:
    """The stream's batches that start at `first_sample` or later, oldest first."""
    statement = (
        select(ReadingBatch)
        .where(ReadingBatch.stream_id == stream_id, ReadingBatch.first_sample >= first_sample)
        .order_by(ReadingBatch.first_sample)
    )
    return [_stored(row) for row in session.scalars(statement)]


def batches_covering(
    session: Session, *, stream_id: str, first_sample: int, stop: int | None = None
) -> list[StoredBatch]:
    """The stream's batches that hold samples from `first_sample` on (before `stop`, if
    given), oldest first."""
    statement = select(ReadingBatch.__table__).where(
        ReadingBatch.stream_id == stream_id,
        ReadingBatch.first_sample + ReadingBatch.count > first_sample,
    )
    if stop is not None:
        statement = statement.where(ReadingBatch.first_sample < stop)
    return [_stored(row) for row in session.execute(statement.order_by(ReadingBatch.first_sample))]


def batches_after_checkpoints(
    session: Session, stream_ids: Sequence[str]
) -> dict[str, list[StoredBatch]]:
    """Each stream's batches from its checkpoint on (from its first reading without one), oldest
    first: what restoring the streams replays."""
    statement = (
        select(ReadingBatch.__table__)  # rows, not ORM objects: many are read at a start-up
        .outerjoin(StreamCheckpoint, StreamCheckpoint.stream_id == ReadingBatch.stream_id)
        .where(
            ReadingBatch.stream_id.in_(stream_ids),
            ReadingBatch.first_sample >= func.coalesce(StreamCheckpoint.sample_count, 0),
        )
        .order_by(ReadingBatch.stream_id, ReadingBatch.first_sample)
    )
    batches: dict[str, list[StoredBatch]] = {}
    for row in session.execute(statement):
        batches.setdefault(row.stream_id, []).append(_stored(row))
    return batches


def existing_at(
    session: Session, *, stream_id: str, times: Sequence[datetime]
) -> dict[datetime, StoredReading]:
    """The stored readings of the stream at any of `times`, keyed by their time."""
    if not times:
        return {}
    statement = select(ReadingBatch).where(
        ReadingBatch.stream_id == stream_id,
        ReadingBatch.last_t >= min(times),
        ReadingBatch.first_t <= max(times),
    )
    wanted = dict(zip(micros(times).tolist(), times, strict=True))
    found: dict[datetime, StoredReading] = {}
    for row in session.scalars(statement):
        batch = _stored(row)
        for index, micro in enumerate(batch.micros.tolist()):
            t = wanted.get(micro)
            if t is None:
                continue
            reference = None if batch.references is None else float(batch.references[index])
            found[t] = StoredReading(
                sample=batch.first_sample + index,
                values=batch.values[index],
                reference=None if reference is None or math.isnan(reference) else reference,
            )
    return found


def sample_at_or_after(session: Session, *, stream_id: str, t: datetime) -> int | None:
    """The number of the stream's first stored reading taken at `t` or later; None if none."""
    statement = (
        select(ReadingBatch.__table__)
        .where(ReadingBatch.stream_id == stream_id, ReadingBatch.last_t >= t)
        .order_by(ReadingBatch.first_sample)
        .limit(1)
    )
    row = session.execute(statement).first()
    if row is None:
        return None
    batch = _stored(row)
    return batch.first_sample + int(np.searchsorted(batch.micros, micro(t), side="left"))


def time_of(session: Session, *, stream_id: str, sample: int) -> datetime | None:
    """When the stream's reading number `sample` was taken; None if it is not stored."""
    statement = (
        select(ReadingBatch)
        .where(ReadingBatch.stream_id == stream_id, ReadingBatch.first_sample <= sample)
        .order_by(ReadingBatch.first_sample.desc())
        .limit(1)
    )
    row = session.scalar(statement)
    if row is None or sample >= row.first_sample + row.count:
        return None
    return datetime_at(int(np.frombuffer(row.times, dtype=_TIMES)[sample - row.first_sample]))


def any_for(session: Session, *, stream_id: str) -> bool:
    """Whether the stream has accepted any reading."""
    statement = select(ReadingBatch.first_sample).where(ReadingBatch.stream_id == stream_id)
    return session.scalar(statement.limit(1)) is not None


def first_time(session: Session, *, stream_id: str) -> datetime | None:
    """When the stream's oldest stored reading was taken (None: it has none)."""
    return _end_time(session, stream_id, newest=False)


def last_time(session: Session, *, stream_id: str) -> datetime | None:
    """When the stream's newest stored reading was taken (None: it has none). Unlike its row's
    `last_t`, written at its checkpoints, this is up to date with every commit."""
    return _end_time(session, stream_id, newest=True)


def _end_time(session: Session, stream_id: str, *, newest: bool) -> datetime | None:
    order = ReadingBatch.first_sample.desc() if newest else ReadingBatch.first_sample
    statement = (
        select(ReadingBatch.times).where(ReadingBatch.stream_id == stream_id).order_by(order)
    )
    times = session.scalar(statement.limit(1))
    if times is None:
        return None
    return datetime_at(int(np.frombuffer(times, dtype=_TIMES)[-1 if newest else 0]))


def count(session: Session, *, stream_id: str) -> int:
    """How many readings the stream has accepted (those a retention period removed too)."""
    statement = select(func.max(ReadingBatch.first_sample + ReadingBatch.count)).where(
        ReadingBatch.stream_id == stream_id
    )
    return int(session.scalar(statement) or 0)


def all_times(session: Session, *, stream_id: str) -> np.ndarray:
    """Every accepted reading's time (microseconds), oldest first."""
    statement = (
        select(ReadingBatch.times)
        .where(ReadingBatch.stream_id == stream_id)
        .order_by(ReadingBatch.first_sample)
    )
    parts = [
        np.frombuffer(blob, dtype=_TIMES).astype(np.int64) for blob in session.scalars(statement)
    ]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
