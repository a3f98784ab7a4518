"""Alarms: open/close, one open alarm per detector, acknowledgement, filtered keyset pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from app.errors import DataError, NotFoundError
from app.storage.db import Database
from app.storage.models import Alarm
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories.pages import Page
from tests.integration.conftest import T0, make_alarm, make_stream


@pytest.fixture
def alarms_db(database: Database) -> Database:
    """Two streams; pump-1 has point alarms at 100, 200, 300 (closed) and 400 (open), a cusum
    alarm at 250 (open); pump-2 a point alarm at 150 (closed)."""
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
        for sample in (100, 200, 300):
            make_alarm(session, "pump-1", sample=sample)
        make_alarm(session, "pump-1", sample=400, closed_after=None)
        make_alarm(session, "pump-1", detector="cusum", sample=250, closed_after=None)
        make_alarm(session, "pump-2", sample=150)
    return database


def opened(page: Page[Alarm]) -> list[int]:
    return [alarm.opened_sample for alarm in page.items]


def test_open_then_close(database: Database) -> None:
    with database.session() as session:
        make_stream(session)
        alarm = make_alarm(session, sample=10, closed_after=None, peak=0.9)
        alarm_id = alarm.id
    with database.session() as session:
        alarm = alarm_repo.require(session, alarm_id)
        assert (alarm.state, alarm.closed_at, alarm.closed_sample) == ("open", None, None)
        alarm_repo.close(
            session, alarm, closed_at=T0 + timedelta(seconds=3), closed_sample=40, peak=1.7
        )
    with database.session() as session:
        alarm = alarm_repo.require(session, alarm_id)
        assert (alarm.state, alarm.closed_sample, alarm.peak) == ("closed", 40, 1.7)
        assert alarm.closed_at == T0 + timedelta(seconds=3)
        with pytest.raises(ValueError, match="already closed"):
            alarm_repo.close(session, alarm, closed_at=T0, closed_sample=41)


def test_one_open_alarm_per_stream_and_detector(database: Database) -> None:
    with database.session() as session:
        make_stream(session)
        make_alarm(session, sample=10, closed_after=None)
        make_alarm(session, detector="cusum", sample=10, closed_after=None)  # other detector
    with pytest.raises(IntegrityError), database.session() as session:
        make_alarm(session, sample=20, closed_after=None)


def test_list_open(alarms_db: Database) -> None:
    with alarms_db.session() as session:
        mine = alarm_repo.list_open(session, stream_id="pump-1")
        assert [(a.detector, a.opened_sample) for a in mine] == [("cusum", 250), ("point", 400)]
        assert alarm_repo.list_open(session, stream_id="pump-2") == []
        assert len(alarm_repo.list_open(session)) == 2


def test_acknowledge_is_idempotent(alarms_db: Database) -> None:
    with alarms_db.session() as session:
        alarm_id = alarm_repo.list_open(session, stream_id="pump-1")[0].id
        first = alarm_repo.acknowledge(session, alarm_id, by="ana", now=T0)
        assert (first.acknowledged_by, first.acknowledged_at) == ("ana", T0)
    with alarms_db.session() as session:
        again = alarm_repo.acknowledge(session, alarm_id, by="bob", now=T0 + timedelta(days=1))
        assert (again.acknowledged_by, again.acknowledged_at) == ("ana", T0)
        with pytest.raises(NotFoundError):
            alarm_repo.acknowledge(session, 10**9, by="ana", now=T0)


def test_filters(alarms_db: Database) -> None:
    with alarms_db.session() as session:
        assert opened(alarm_repo.page(session)) == [400, 300, 250, 200, 150, 100]
        assert opened(alarm_repo.page(session, stream_id="pump-2")) == [150]
        assert opened(alarm_repo.page(session, detector="cusum")) == [250]
        assert opened(alarm_repo.page(session, state="open")) == [400, 250]
        assert opened(alarm_repo.page(session, state="closed", stream_id="pump-1")) == [
            300,
            200,
            100,
        ]
        window = alarm_repo.page(
            session, since=T0 + timedelta(seconds=15), until=T0 + timedelta(seconds=30)
        )
        assert opened(window) == [250, 200, 150]  # since inclusive, until exclusive


def test_cursor_pages_cover_every_alarm_once(alarms_db: Database) -> None:
    with alarms_db.session() as session:
        seen: list[int] = []
        cursor = None
        pages = 0
        while True:
            page = alarm_repo.page(session, limit=4, cursor=cursor, stream_id="pump-1")
            seen += opened(page)
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [400, 300, 250, 200, 100]
        assert pages == 2


def test_cursor_breaks_ties_on_the_same_opening_time_by_id(database: Database) -> None:
    with database.session() as session:
        make_stream(session)
        for detector in ("point", "cusum", "rolling_rms", "level"):
            make_alarm(session, detector=detector, sample=100)
    with database.session() as session:
        everything = alarm_repo.page(session, limit=100).items
        ids: list[int] = []
        cursor = None
        while True:
            page = alarm_repo.page(session, limit=1, cursor=cursor)
            ids += [alarm.id for alarm in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert ids == [alarm.id for alarm in everything]
        assert ids == sorted(ids, reverse=True)


def test_a_new_alarm_does_not_shift_later_pages(alarms_db: Database) -> None:
    with alarms_db.session() as session:
        first = alarm_repo.page(session, limit=2)
        assert first.next_cursor is not None
    with alarms_db.session() as session:
        make_alarm(session, "pump-2", sample=900)
    with alarms_db.session() as session:
        second = alarm_repo.page(session, limit=2, cursor=first.next_cursor)
        assert opened(second) == [250, 200]


# (The last: a row id past BIGINT's range, which the database would refuse with an overflow.)
@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!",
        "",
        "bm90LWEtY3Vyc29y",
        "MjAyNS0wMS0wMXw1",
        "MjAyNS0wMS0wMVQwMDowMDowMCswMDowMHw5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OQ",
    ],
)
def test_a_bad_cursor_is_a_data_error(alarms_db: Database, cursor: str) -> None:
    with alarms_db.session() as session, pytest.raises(DataError, match="invalid cursor"):
        alarm_repo.page(session, cursor=cursor)
