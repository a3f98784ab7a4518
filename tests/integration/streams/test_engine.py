"""The engine against a real database: rebuilt from checkpoints and readings, never stale."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from app.main import register_models
from app.metrics import Metrics
from app.registry import default_loader, load_models
from app.schemas import ReadingIn
from app.storage.db import Database, DatabaseError
from app.storage.repositories import checkpoints, streams
from app.storage.repositories import readings as reading_repo
from app.streams.engine import StreamEngine
from tests.support.models import calibrated_lab_model, lab_series, stateful_lab_model

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def batch(first: int, count: int) -> list[ReadingIn]:
    return [
        ReadingIn(t=T0 + timedelta(milliseconds=100 * i), value=float(i % 7))
        for i in range(first, first + count)
    ]


def make_engine(
    database: Database, tmp_path: Path, *, stream: str = "p", checkpoint_every: int = 1000
) -> StreamEngine:
    if not (tmp_path / "models").exists():
        calibrated_lab_model(tmp_path / "models")
    registry = load_models(tmp_path / "models", loaded_at=T0, loader=default_loader)
    register_models(database, registry)
    with database.session() as session:
        streams.create(
            session,
            stream_id=stream,
            model_name="lstm-seed0",
            channels=["value"],
            sample_period_s=0.1,
            has_reference=False,
            detector_overrides={},
            now=T0,
        )
    return StreamEngine(database, registry, Metrics(), checkpoint_every=checkpoint_every)


@pytest.fixture
def engine(database: Database, tmp_path: Path) -> StreamEngine:
    return make_engine(database, tmp_path)


def results(
    engine: StreamEngine, sizes: list[int], first: int = 0, stream: str = "p"
) -> list[float]:
    residuals: list[float] = []
    for size in sizes:
        outcome = engine.ingest(stream, batch(first, size))
        assert outcome.result is not None and len(outcome.accepted) == size
        residuals.extend(outcome.result.residual.tolist())
        first += size
    return residuals


SIZES = [100, 7, 1, 1, 250, 13, 1, 300, 50, 1, 1, 1, 30]  # 756 readings


@pytest.mark.parametrize("checkpoint_every", [1, 97, 100_000])
def test_a_stream_rebuilt_from_the_database_continues_exactly(
    database: Database, tmp_path: Path, checkpoint_every: int
) -> None:
    """Checkpoint + the readings after it, replayed in their original batches, give the state
    the stream had: the continuation is bit for bit the same as never having stopped."""
    engine = make_engine(database, tmp_path, checkpoint_every=checkpoint_every)
    results(engine, SIZES)
    engine.forget("p")  # as after a restart: only the database remains
    resumed = results(engine, [5, 1, 40], first=756)

    reference = make_engine(database, tmp_path, stream="q")
    results(reference, SIZES, stream="q")
    expected = results(reference, [5, 1, 40], first=756, stream="q")
    assert resumed == expected


def test_a_failed_commit_leaves_no_trace_in_the_live_state(
    engine: StreamEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    results(engine, [100])
    real_insert = reading_repo.insert_batches

    def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(reading_repo, "insert_batches", fail)
    with pytest.raises(DatabaseError, match="safe to re-send"):
        engine.ingest("p", batch(100, 10))
    monkeypatch.setattr(reading_repo, "insert_batches", real_insert)
    again = engine.ingest("p", batch(100, 10))  # the retry is processed from the old state
    assert again.duplicates == 0 and len(again.accepted) == 10
    assert again.result is not None and again.result.first_sample == 100


def test_reads_see_committed_batches_only(engine: StreamEngine, database: Database) -> None:
    results(engine, [100])
    engine.forget("p")
    with database.session() as session:
        view = engine.view(session, streams.require(session, "p"))
    assert view.samples == 100 and view.last_t == batch(99, 1)[0].t
    results(engine, [10], first=100)
    assert engine.position("p") == (110, batch(109, 1)[0].t)


def test_a_clean_stop_checkpoints_every_stream_that_moved(
    engine: StreamEngine, database: Database, tmp_path: Path
) -> None:
    results(engine, [50, 30])  # below checkpoint_every (1000): nothing checkpointed yet
    assert engine.checkpoint_all() == 1
    assert engine.checkpoint_all() == 0  # already saved
    with database.session() as session:
        saved = checkpoints.get(session, "p")
        assert saved is not None and saved.sample_count == 80
        assert streams.require(session, "p").sample_count == 80
    engine.forget("p")  # as at the next start: nothing to replay, and it continues exactly
    resumed = results(engine, [3], first=80)
    reference = make_engine(database, tmp_path, stream="q")
    expected = results(reference, [50, 30, 3], stream="q")[80:]
    assert not np.isnan(resumed).any() and resumed == expected


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A window LSTM and a stateful LSTM, both calibrated on the lab's hold-out."""
    directory = tmp_path_factory.mktemp("models")
    calibrated_lab_model(directory)
    stateful_lab_model(directory)
    return directory


def test_streams_of_two_models_in_one_request_equal_each_alone(
    database: Database, two_kinds: Path
) -> None:
    registry = load_models(two_kinds, loaded_at=T0, loader=default_loader)
    register_models(database, registry)
    models = {"w": "lstm-seed0", "s1": "lstm-stateful-lab", "s2": "lstm-stateful-lab"}
    with database.session() as session:
        for prefix in ("", "alone-"):
            for stream, model in models.items():
                streams.create(
                    session,
                    stream_id=prefix + stream,
                    model_name=model,
                    channels=["value"],
                    sample_period_s=0.1,
                    has_reference=False,
                    detector_overrides={},
                    now=T0,
                )
    engine = StreamEngine(database, registry, Metrics())
    values = lab_series().value
    offsets = {"w": 6000, "s1": 6900, "s2": 7000}  # s2 meets the lab's faults

    def reading(stream: str, k: int) -> list[ReadingIn]:
        at = T0 + timedelta(milliseconds=100 * k)
        return [ReadingIn(t=at, value=float(values[offsets[stream] + k]))]

    together: dict[str, list[float]] = {s: [] for s in models}
    alone: dict[str, list[float]] = {s: [] for s in models}
    opened: dict[str, list[tuple[str, int]]] = {s: [] for s in models}
    for k in range(400):
        outcomes = engine.ingest_many([(s, reading(s, k)) for s in models])
        for stream, outcome in zip(models, outcomes, strict=True):
            assert outcome.result is not None
            together[stream].extend(outcome.result.residual.tolist())
            opened[stream].extend((a.detector, a.opened_sample) for a in outcome.opened)
            single = engine.ingest("alone-" + stream, reading(stream, k))
            assert single.result is not None
            alone[stream].extend(single.result.residual.tolist())
            assert [(a.detector, a.opened_sample) for a in single.opened] == [
                (a.detector, a.opened_sample) for a in outcome.opened
            ]
    for stream in models:
        np.testing.assert_allclose(together[stream], alone[stream], rtol=0, atol=1e-6)
        assert np.isfinite(together[stream][-100:]).all()
    assert opened["s2"], "the stateful stream running into the faults raised alarms"
