"""The engine against a real database: reads never leave a stale state behind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.main import register_models
from app.metrics import Metrics
from app.registry import default_loader, load_models
from app.schemas import ReadingIn
from app.storage.db import Database
from app.storage.repositories import checkpoints, streams
from app.streams.engine import StreamEngine
from tests.support.models import calibrated_lab_model

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def batch(first: int, count: int) -> list[ReadingIn]:
    return [
        ReadingIn(t=T0 + timedelta(milliseconds=100 * i), value=float(i % 7))
        for i in range(first, first + count)
    ]


@pytest.fixture
def engine(database: Database, tmp_path: Path) -> StreamEngine:
    calibrated_lab_model(tmp_path / "models")
    registry = load_models(tmp_path / "models", loaded_at=T0, loader=default_loader)
    register_models(database, registry)
    with database.session() as session:
        streams.create(
            session,
            stream_id="p",
            model_name="lstm-seed0",
            channels=["value"],
            sample_period_s=0.1,
            has_reference=False,
            detector_overrides={},
            now=T0,
        )
    return StreamEngine(database, registry, Metrics())


def test_a_read_racing_an_ingest_leaves_no_stale_state(
    engine: StreamEngine, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.ingest("p", batch(0, 100))
    engine.forget("p")  # as after a reconfiguration: the checkpoint is only in the database
    original = checkpoints.get

    def get_then_let_a_post_run(session, stream_id):  # type: ignore[no-untyped-def]
        checkpoint = original(session, stream_id)
        monkeypatch.setattr(checkpoints, "get", original)
        assert engine.ingest("p", batch(100, 100)).duplicates == 0  # a POST completes meanwhile
        return checkpoint

    monkeypatch.setattr(checkpoints, "get", get_then_let_a_post_run)
    with database.session() as session:
        stale = engine.live(session, streams.require(session, "p"), remember=False)  # a GET
    assert stale.state.samples == 100
    for first in (200, 210, 220):
        assert len(engine.ingest("p", batch(first, 10)).accepted) == 10
