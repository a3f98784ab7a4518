"""Streams: create, update, advance, and delete with everything that belongs to them."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.errors import ConflictError, NotFoundError
from app.storage.db import Database
from app.storage.models import Alarm, ReadingBatch, StreamCheckpoint
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from tests.integration.conftest import T0, make_alarm, make_stream


def test_create_get_and_list(session: Session) -> None:
    make_stream(session, "b-stream")
    make_stream(session, "a-stream")
    stream = stream_repo.require(session, "b-stream")
    assert (stream.model_name, stream.channels, stream.sample_count, stream.last_t) == (
        "lstm-seed0",
        ["value"],
        0,
        None,
    )
    assert [s.id for s in stream_repo.list_all(session)] == ["a-stream", "b-stream"]
    assert stream_repo.get(session, "nope") is None
    with pytest.raises(NotFoundError, match="'nope' does not exist"):
        stream_repo.require(session, "nope")


def test_update_and_advance(session: Session) -> None:
    stream = make_stream(session)
    later = T0 + timedelta(hours=1)
    stream_repo.update(
        session,
        stream,
        model_name="lstm-seed0",
        channels=["value"],
        sample_period_s=0.5,
        has_reference=True,
        detector_overrides={"point": {"threshold": 0.7}},
        now=later,
    )
    stream_repo.advance(session, stream.id, sample_count=42, last_t=later)
    session.expire_all()
    stored = stream_repo.require(session, "pump-1")
    assert stored.sample_period_s == 0.5
    assert stored.has_reference is True
    assert stored.detector_overrides == {"point": {"threshold": 0.7}}
    assert (stored.sample_count, stored.last_t, stored.updated_at) == (42, later, later)
    assert stored.created_at == T0


def test_a_stream_needs_a_registered_model(database: Database) -> None:
    with pytest.raises(ConflictError, match="not registered"), database.session() as session:
        stream_repo.create(
            session,
            stream_repo.NewStream(
                stream_id="orphan",
                model_name="never-loaded",
                channels=["value"],
                sample_period_s=0.1,
                has_reference=False,
                detector_overrides={},
            ),
            now=T0,
        )


def test_delete_cascades_to_alarms_checkpoint_and_readings(database: Database) -> None:
    with database.session() as session:
        make_stream(session, "doomed")
        make_stream(session, "kept")
        for stream_id in ("doomed", "kept"):
            make_alarm(session, stream_id)
            checkpoint_repo.save(
                session, [checkpoint_repo.Saved(stream_id, 1, T0, b"state", 1)], now=T0
            )
            micros = reading_repo.micros([T0])
            reading_repo.insert_batches(
                session, [reading_repo.NewBatch(stream_id, 0, micros, np.array([[1.0]]))]
            )
    with database.session() as session:
        stream_repo.delete(session, "doomed")
    with database.session() as session:
        assert stream_repo.get(session, "doomed") is None
        for model in (Alarm, StreamCheckpoint, ReadingBatch):
            owners = session.scalars(select(model.stream_id).distinct()).all()
            assert owners == ["kept"], model.__tablename__
        assert session.scalar(select(func.count()).select_from(Alarm)) == 1


def test_creating_an_existing_stream_is_a_conflict(database: Database) -> None:
    with database.session() as session:
        make_stream(session, "twice")
    with pytest.raises(ConflictError, match="created concurrently"), database.session() as session:
        make_stream(session, "twice")


def test_deleting_an_unknown_stream_is_not_found(session: Session) -> None:
    with pytest.raises(NotFoundError):
        stream_repo.delete(session, "ghost")
