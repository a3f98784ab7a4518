"""Checkpoints: one per stream, replaced in place, bytes kept exactly."""

from __future__ import annotations

from datetime import timedelta

from app.storage.db import Database
from app.storage.repositories import checkpoints as checkpoint_repo
from tests.integration.conftest import T0, make_stream


def test_save_replaces_the_streams_checkpoint(database: Database) -> None:
    blob = bytes(range(256)) * 40  # every byte value, including NUL
    with database.session() as session:
        make_stream(session)
        assert checkpoint_repo.get(session, "pump-1") is None
        checkpoint_repo.save(
            session,
            stream_id="pump-1",
            sample_count=10,
            last_t=T0,
            state=b"old",
            state_version=1,
            now=T0,
        )
    with database.session() as session:
        checkpoint_repo.save(
            session,
            stream_id="pump-1",
            sample_count=20,
            last_t=T0 + timedelta(seconds=2),
            state=blob,
            state_version=2,
            now=T0 + timedelta(seconds=3),
        )
    with database.session() as session:
        checkpoint = checkpoint_repo.get(session, "pump-1")
        assert checkpoint is not None
        assert checkpoint.state == blob
        assert (checkpoint.sample_count, checkpoint.state_version) == (20, 2)
        assert checkpoint.last_t == T0 + timedelta(seconds=2)
        assert checkpoint.updated_at == T0 + timedelta(seconds=3)
