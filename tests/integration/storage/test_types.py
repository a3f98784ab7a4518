"""Datetimes come back timezone-aware UTC from every database, whatever zone went in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import StatementError

from app.storage.db import Database
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import streams as stream_repo
from tests.integration.conftest import make_stream


def test_aware_datetimes_round_trip_as_utc(database: Database) -> None:
    paris = timezone(timedelta(hours=2))
    moment = datetime(2025, 6, 1, 14, 30, 15, 123456, tzinfo=paris)
    with database.session() as session:
        stream = make_stream(session)
        stream_repo.advance(session, stream.id, sample_count=1, last_t=moment)
    with database.session() as session:
        stored = stream_repo.require(session, "pump-1")
        assert stored.last_t == moment
        assert stored.last_t is not None and stored.last_t.tzinfo is not None
        assert stored.last_t.utcoffset() == timedelta(0)
        assert stored.last_t.hour == 12  # 14:30 in UTC+2
        assert stored.created_at.tzinfo is not None


def test_naive_datetimes_are_refused(database: Database) -> None:
    with pytest.raises(StatementError, match="naive datetime"), database.session() as session:
        stream = make_stream(session)
        stream_repo.advance(session, stream.id, sample_count=1, last_t=datetime(2025, 1, 1))
    with database.session() as session:
        assert stream_repo.get(session, "pump-1") is None  # the whole unit of work rolled back


def test_times_compare_in_utc_order_across_zones(database: Database) -> None:
    """SQLite stores text: storing naive UTC keeps its comparisons in time order."""
    early_in_tokyo = datetime(2025, 1, 1, 8, 0, tzinfo=timezone(timedelta(hours=9)))  # 23:00Z
    later_in_utc = datetime(2024, 12, 31, 23, 30, tzinfo=UTC)
    with database.session() as session:
        make_stream(session)
        for detector, opened_at in (("point", early_in_tokyo), ("cusum", later_in_utc)):
            alarm_repo.create(
                session,
                stream_id="pump-1",
                detector=detector,
                opened_at=opened_at,
                opened_sample=1,
                peak=1.0,
                threshold=0.5,
                model_name="lstm-seed0",
                model_version="test",
            )
    with database.session() as session:
        page = alarm_repo.page(session, since=datetime(2024, 12, 31, 23, 15, tzinfo=UTC))
        assert [alarm.detector for alarm in page.items] == ["cusum"]
