"""Readings packed per batch: idempotent insert on (stream, first sample), exact round trips of
times and numbers (NaN for a missing one), and the look-ups the engine needs."""

from __future__ import annotations

import math
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from pydantic import TypeAdapter
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.orm import Session

from app.storage.db import Database
from app.storage.models import ReadingBatch
from app.storage.repositories import readings as reading_repo
from app.storage.repositories.readings import NewBatch
from tests.integration.conftest import T0, make_stream


def time_at(sample: int) -> datetime:
    return T0 + timedelta(seconds=sample / 10)


def batch(first: int, count: int, stream_id: str = "pump-1", *, channels: int = 1) -> NewBatch:
    samples = np.arange(first, first + count)
    return NewBatch(
        stream_id=stream_id,
        first_sample=first,
        micros=reading_repo.micros([time_at(int(i)) for i in samples]),
        values=np.repeat(samples[:, None] * 0.5, channels, axis=1),
        references=np.ones(count),
    )


@pytest.fixture
def stream_db(database: Database) -> Database:
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
    return database


def insert(session: Session, *batches: NewBatch) -> int:
    return reading_repo.insert_batches(session, list(batches))


def test_insert_skips_a_batch_whose_first_sample_is_stored(stream_db: Database) -> None:
    with stream_db.session() as session:
        assert insert(session, batch(0, 5), batch(5, 1), batch(0, 3, "pump-2")) == 3
    with stream_db.session() as session:
        # Another request claiming sample 5 again (a concurrent writer): not inserted, and
        # the caller learns it from the count.
        assert insert(session, batch(5, 4), batch(6, 2)) == 1
        assert insert(session) == 0
    with stream_db.session() as session:
        assert reading_repo.count(session, stream_id="pump-1") == 8
        assert reading_repo.count(session, stream_id="pump-2") == 3
        assert reading_repo.any_for(session, stream_id="pump-2")
        assert reading_repo.count(session, stream_id="nobody") == 0
        assert not reading_repo.any_for(session, stream_id="nobody")


@pytest.mark.parametrize("channels", [1, 3])
def test_batches_come_back_exactly_and_oldest_first(stream_db: Database, channels: int) -> None:
    odd_times = [T0 + timedelta(microseconds=1), T0 + timedelta(days=3, microseconds=999_999)]
    odd = NewBatch(
        stream_id="pump-1",
        first_sample=7,
        micros=reading_repo.micros(odd_times),
        values=np.array([[math.nan] * channels, [1e-300, *([-2.5] * (channels - 1))]]),
        references=np.array([math.nan, 3.25]),
    )
    with stream_db.session() as session:
        insert(session, batch(0, 4, channels=channels), odd, batch(2, 1, "pump-2"))
        insert(session, batch(4, 3, channels=channels))
    with stream_db.session() as session:
        stored = reading_repo.batches_from(session, stream_id="pump-1")
        assert [(b.first_sample, b.stop) for b in stored] == [(0, 4), (4, 7), (7, 9)]
        assert stored[2].last_t == odd_times[1] and stored[2].last_t.tzinfo is not None
        assert [reading_repo.datetime_at(m) for m in stored[2].micros.tolist()] == odd_times
        np.testing.assert_array_equal(stored[2].values, odd.values)
        np.testing.assert_array_equal(stored[2].references, odd.references)
        np.testing.assert_array_equal(stored[0].values, batch(0, 4, channels=channels).values)
        later = reading_repo.batches_from(session, stream_id="pump-1", first_sample=4)
        assert [b.first_sample for b in later] == [4, 7]


def test_a_stream_without_references_stores_none(stream_db: Database) -> None:
    plain = NewBatch("pump-1", 0, reading_repo.micros([T0]), np.array([[1.0]]), None)
    with stream_db.session() as session:
        insert(session, plain)
    with stream_db.session() as session:
        (stored,) = reading_repo.batches_from(session, stream_id="pump-1")
        assert stored.references is None
        (row,) = session.query(ReadingBatch).all()
        assert row.reference_values is None and row.count == 1


def test_one_insert_of_streams_with_and_without_references_and_channels(
    stream_db: Database,
) -> None:
    """A request mixes streams: their batches go in one statement, each comes back its own."""
    wide = batch(0, 3, channels=3)
    plain = NewBatch("pump-2", 0, reading_repo.micros([T0]), np.array([[-1.5]]), None)
    with stream_db.session() as session:
        assert insert(session, wide, plain, batch(3, 1)) == 3
    with stream_db.session() as session:
        first, second = reading_repo.batches_from(session, stream_id="pump-1")
        np.testing.assert_array_equal(first.values, wide.values)
        np.testing.assert_array_equal(first.micros, wide.micros)
        np.testing.assert_array_equal(second.values, batch(3, 1).values)
        np.testing.assert_array_equal(second.references, [1.0])
        (alone,) = reading_repo.batches_from(session, stream_id="pump-2")
        assert alone.references is None and alone.values.tolist() == [[-1.5]]
        assert alone.micros.tolist() == plain.micros.tolist()


def test_existing_at_finds_readings_across_batches_by_time(stream_db: Database) -> None:
    with_gaps = NewBatch(
        stream_id="pump-1",
        first_sample=30,
        micros=reading_repo.micros([time_at(30), time_at(31)]),
        values=np.array([[math.nan], [7.0]]),
        references=np.array([math.nan, 2.0]),
    )
    with stream_db.session() as session:
        insert(session, batch(0, 10), batch(10, 20), with_gaps, batch(0, 40, "pump-2"))
    with stream_db.session() as session:
        wanted = [time_at(i) for i in (3, 9, 10, 29, 30, 31)] + [
            time_at(32),
            time_at(2) + timedelta(microseconds=1),
        ]
        found = reading_repo.existing_at(session, stream_id="pump-1", times=wanted)
        assert sorted(found) == wanted[:6]
        assert [found[t].sample for t in wanted[:6]] == [3, 9, 10, 29, 30, 31]
        assert found[time_at(9)].values.tolist() == [4.5] and found[time_at(9)].reference == 1.0
        assert math.isnan(found[time_at(30)].values[0]) and found[time_at(30)].reference is None
        assert found[time_at(31)].reference == 2.0
        assert reading_repo.existing_at(session, stream_id="pump-1", times=[]) == {}


def test_time_of_a_sample(stream_db: Database) -> None:
    with stream_db.session() as session:
        insert(session, batch(0, 10), batch(10, 5))
    with stream_db.session() as session:
        for sample in (0, 9, 10, 14):
            assert reading_repo.time_of(session, stream_id="pump-1", sample=sample) == time_at(
                sample
            )
        assert reading_repo.time_of(session, stream_id="pump-1", sample=15) is None
        assert reading_repo.time_of(session, stream_id="pump-2", sample=0) is None


def test_micros_are_exact_and_refuse_naive_times() -> None:
    paris = timezone(timedelta(hours=1))
    times = [
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        T0 + timedelta(microseconds=1),
        datetime(2027, 1, 1, 0, 30, 0, 123_457, tzinfo=paris),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ]
    micros = reading_repo.micros(times)
    assert micros.dtype == np.int64
    assert [reading_repo.datetime_at(m) for m in micros.tolist()] == times
    with pytest.raises(ValueError, match="naive datetime"):
        reading_repo.micros([T0, T0.replace(tzinfo=None)])


@pytest.mark.parametrize("zone", ["pydantic Z", "pydantic +01:00", "fixed -05:00", "Europe/Paris"])
def test_micros_of_times_in_one_zone_are_exact(zone: str) -> None:
    """Times sharing one fixed-offset zone object (pydantic's UTC, as a request's times come)
    take a faster path; every case stays exact, and a zone with daylight saving time is not
    mistaken for a fixed offset."""
    start = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # Paris moves to summer time at 01:00 UTC
    utc_times = [start + timedelta(minutes=15 * i, microseconds=i) for i in range(12)]
    if zone.startswith("pydantic"):
        offset = timedelta(hours=0 if zone.endswith("Z") else 1)
        parsed = TypeAdapter(list[datetime]).validate_python(
            [t.astimezone(timezone(offset)).isoformat() for t in utc_times]
        )
        if zone.endswith("Z"):
            assert len({id(t.tzinfo) for t in parsed}) == 1
    elif zone.startswith("fixed"):
        minus_five = timezone(timedelta(hours=-5))
        parsed = [t.astimezone(minus_five) for t in utc_times]
    else:
        paris = zoneinfo.ZoneInfo(zone)
        parsed = [t.astimezone(paris) for t in utc_times]
    expected = [(t - reading_repo.EPOCH) // timedelta(microseconds=1) for t in utc_times]
    assert reading_repo.micros(parsed).tolist() == expected
    # Led by a time in another fixed zone, the others are subtracted with their offsets.
    led = [datetime(2026, 3, 29, tzinfo=timezone(timedelta(hours=3))), *parsed]
    first = (led[0] - reading_repo.EPOCH) // timedelta(microseconds=1)
    assert reading_repo.micros(led).tolist() == [first, *expected]


def test_batches_of_mismatched_shapes_are_refused(stream_db: Database) -> None:
    wrong = NewBatch("pump-1", 0, reading_repo.micros([T0, time_at(1)]), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="shape"), stream_db.session() as session:
        insert(session, wrong)


def test_batch_times_are_stored_as_the_orm_stores_them() -> None:
    """The SQLite insert formats first_t and last_t itself: exactly as the column type's bind
    processor, so the ORM's time comparisons in `existing_at` hold."""
    dialect = sqlite_dialect.dialect()
    column_type = ReadingBatch.__table__.c.last_t.type.dialect_impl(dialect)
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


def test_pack_merges_the_small_rows_a_checkpoint_passed_and_keeps_every_reading(
    stream_db: Database,
) -> None:
    """Ticks of one reading become one row once checkpointed past; a big batch, the rows after
    the checkpoint and another stream's rows stay as they were; every reading reads back the
    same, by sample and by time, and a batch without references packs as NaN beside one with."""
    singles = [batch(i, 1) for i in range(10)]
    singles[3] = NewBatch("pump-1", 3, singles[3].micros, singles[3].values, None)
    with stream_db.session() as session:
        insert(session, *singles, batch(10, 100), *[batch(110 + i, 1) for i in range(5)])
        insert(session, *[batch(i, 1, "pump-2") for i in range(5)])
        insert(session, *[batch(115 + i, 1) for i in range(5)])  # after the checkpoint
    with stream_db.session() as session:
        before = reading_repo.batches_from(session, stream_id="pump-1")
        assert reading_repo.pack(session, stream_id="pump-1", before_sample=115) == 15
    with stream_db.session() as session:
        after = reading_repo.batches_from(session, stream_id="pump-1")
        assert [(b.first_sample, len(b.micros)) for b in after] == [
            (0, 10),
            (10, 100),
            (110, 5),
        ] + [(115 + i, 1) for i in range(5)]
        for name in ("micros", "values", "references_or_nan"):
            np.testing.assert_array_equal(
                np.concatenate([getattr(b, name) for b in after]),
                np.concatenate([getattr(b, name) for b in before]),
            )
        assert math.isnan(after[0].references_or_nan[3])
        assert len(reading_repo.batches_from(session, stream_id="pump-2")) == 5
        found = reading_repo.existing_at(session, stream_id="pump-1", times=[time_at(7)])
        assert found[time_at(7)].sample == 7
        assert reading_repo.time_of(session, stream_id="pump-1", sample=112) == time_at(112)
        assert reading_repo.pack(session, stream_id="pump-1", before_sample=115) == 0
