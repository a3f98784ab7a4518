"""Checkpoints: one per stream, replaced in place, bytes kept exactly."""

from __future__ import annotations

from datetime import timedelta

from app.storage.db import Database
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories.checkpoints import Saved
from tests.integration.conftest import T0, make_stream


def test_save_replaces_the_streams_checkpoint(database: Database) -> None:
    blob = bytes(range(256)) * 40  # every byte value, including NUL
    with database.session() as session:
        make_stream(session)
        assert checkpoint_repo.get(session, "pump-1") is None
        checkpoint_repo.save(session, [Saved("pump-1", 10, T0, b"old", 1)], now=T0)
    with database.session() as session:
        later = T0 + timedelta(seconds=2)
        checkpoint_repo.save(session, [Saved("pump-1", 20, later, blob, 2)], now=later)
    with database.session() as session:
        checkpoint = checkpoint_repo.get(session, "pump-1")
        assert checkpoint is not None
        assert checkpoint.state == blob
        assert (checkpoint.sample_count, checkpoint.state_version) == (20, 2)
        assert checkpoint.last_t == T0 + timedelta(seconds=2)
        assert checkpoint.updated_at == T0 + timedelta(seconds=2)


def test_save_writes_many_streams_at_once_inserting_or_replacing(database: Database) -> None:
    with database.session() as session:
        for stream_id in ("a", "b", "c"):
            make_stream(session, stream_id)
        checkpoint_repo.save(session, [Saved("a", 1, None, b"a1", 2)], now=T0)
    with database.session() as session:
        held = checkpoint_repo.get(session, "a")
        rows = [Saved(i, 5, T0, i.encode() * 3, 2) for i in ("a", "b", "c")]
        checkpoint_repo.save(session, rows, now=T0)
        assert held is not None and held.state == b"aaa"  # (what the session holds follows)
    with database.session() as session:
        saved = checkpoint_repo.get_many(session, ["a", "b", "c"])
        assert {i: (row.sample_count, row.state) for i, row in saved.items()} == {
            "a": (5, b"aaa"),
            "b": (5, b"bbb"),
            "c": (5, b"ccc"),
        }
