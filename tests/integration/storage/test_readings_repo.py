"""Readings: idempotent batch insert on (stream, t) and the look-ups the engine needs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.orm import Session

from app.storage.db import Database
from app.storage.models import Reading
from app.storage.repositories import readings as reading_repo
from app.storage.repositories.readings import NewReading
from tests.integration.conftest import T0, make_stream


def at(sample: int, stream_id: str = "pump-1") -> NewReading:
    return NewReading(
        stream_id=stream_id,
        sample=sample,
        t=T0 + timedelta(seconds=sample / 10),
        value=sample * 0.5,
        reference=1.0,
    )


@pytest.fixture
def stream_db(database: Database) -> Database:
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
    return database


def insert(session: Session, stream_id: str, samples: range) -> int:
    return reading_repo.insert_many(session, [at(i, stream_id) for i in samples])


def test_insert_many_skips_what_is_already_stored(stream_db: Database) -> None:
    with stream_db.session() as session:
        assert insert(session, "pump-1", range(5)) == 5
    with stream_db.session() as session:
        # A re-send of 3..4 with two new readings: only the new ones are inserted.
        assert insert(session, "pump-1", range(3, 7)) == 2
        assert insert(session, "pump-1", range(0)) == 0
        # Same times on another stream are not duplicates.
        assert insert(session, "pump-2", range(3)) == 3
    with stream_db.session() as session:
        assert reading_repo.count(session, stream_id="pump-1") == 7
        assert reading_repo.count(session, stream_id="pump-2") == 3


def test_a_reading_at_a_stored_time_is_skipped_whatever_its_sample(stream_db: Database) -> None:
    with stream_db.session() as session:
        reading_repo.insert_many(session, [at(0)])
        clash = NewReading(stream_id="pump-1", sample=99, t=at(0).t, value=123.0)
        assert reading_repo.insert_many(session, [clash]) == 0
        stored = reading_repo.existing_at(session, stream_id="pump-1", times=[at(0).t])
        assert stored[at(0).t].value == 0.0  # the first value stays


def test_existing_at_returns_stored_readings_by_time(stream_db: Database) -> None:
    with stream_db.session() as session:
        reading_repo.insert_many(
            session,
            [
                at(0),
                NewReading(stream_id="pump-1", sample=1, t=at(1).t, value=None, reference=None),
                NewReading(
                    stream_id="pump-1",
                    sample=2,
                    t=at(2).t,
                    value=2.5,
                    values={"value": 2.5, "load": None},
                ),
            ],
        )
    with stream_db.session() as session:
        wanted = [at(i).t for i in (0, 1, 2, 3)]
        found = reading_repo.existing_at(session, stream_id="pump-1", times=wanted)
        assert sorted(found) == wanted[:3]
        assert (found[at(0).t].value, found[at(0).t].reference) == (0.0, 1.0)
        assert (found[at(1).t].value, found[at(1).t].reference) == (None, None)
        assert found[at(2).t].values == {"value": 2.5, "load": None}
        assert found[at(0).t].values is None
        assert reading_repo.existing_at(session, stream_id="pump-2", times=wanted) == {}


def test_single_channel_values_are_sql_null(stream_db: Database) -> None:
    with stream_db.session() as session:
        reading_repo.insert_many(session, [at(0)])
    with stream_db.session() as session:
        nulls = session.scalar(
            select(text("count(*)")).select_from(Reading).where(Reading.values.is_(None))
        )
        assert nulls == 1


def test_existing_at_handles_more_times_than_one_query_binds(stream_db: Database) -> None:
    batch = [at(i) for i in range(2500)]
    with stream_db.session() as session:
        assert reading_repo.insert_many(session, batch) == 2500
    with stream_db.session() as session:
        times = [reading.t for reading in batch[::2]]
        found = reading_repo.existing_at(session, stream_id="pump-1", times=times)
        assert len(found) == 1250
        assert found[batch[2498].t].sample == 2498


def test_tail_and_by_sample_are_oldest_first(stream_db: Database) -> None:
    with stream_db.session() as session:
        reading_repo.insert_many(session, [at(i) for i in range(10)])
    with stream_db.session() as session:
        assert [r.sample for r in reading_repo.tail(session, stream_id="pump-1", limit=3)] == [
            7,
            8,
            9,
        ]
        window = reading_repo.by_sample(session, stream_id="pump-1", start=4, stop=7)
        assert [r.sample for r in window] == [4, 5, 6]
        rest = reading_repo.by_sample(session, stream_id="pump-1", start=8)
        assert [r.sample for r in rest] == [8, 9]
        assert rest[0].t == at(8).t and rest[0].t.tzinfo is not None


def test_naive_times_are_refused(stream_db: Database) -> None:
    naive = NewReading(stream_id="pump-1", sample=0, t=at(0).t.replace(tzinfo=None), value=1.0)
    with pytest.raises(ValueError, match="naive datetime"), stream_db.session() as session:
        reading_repo.insert_many(session, [naive])


def test_readings_times_are_stored_as_the_orm_stores_them() -> None:
    """The SQLite insert formats times itself: exactly as the column type's bind processor."""
    dialect = sqlite_dialect.dialect()
    column_type = Reading.__table__.c.t.type.dialect_impl(dialect)
    processor = column_type.bind_processor(dialect)
    assert processor is not None
    paris = timezone(timedelta(hours=1))
    for t in (
        T0,
        T0 + timedelta(microseconds=1),
        datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2027, 1, 1, 0, 30, tzinfo=paris),
    ):
        assert reading_repo.sqlite_time(t) == processor(t)
