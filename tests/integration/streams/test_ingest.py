"""Ingest and the live streams against a real database: restored exactly from checkpoints and
readings, never stale after a failed transaction, and a gateway's tick equal to each stream
alone."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from app.catalogue import register_models
from app.errors import ConflictError, DataError, NotFoundError
from app.metrics import Metrics
from app.registry import default_loader, load_models
from app.schemas import ReadingIn
from app.service.readings import new_readings
from app.storage.db import Database
from app.storage.repositories import checkpoints, streams
from app.storage.repositories import readings as reading_repo
from app.streams import handover
from app.streams import live as live_module
from app.streams.handover import Target
from app.streams.ingest import IngestOutcome, ingest
from app.streams.live import LiveStreams
from tests.support.checkpoints import twinwatch_0_1
from tests.support.models import calibrated_lab_model, lab_series, stateful_lab_model

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A window LSTM and a stateful LSTM, both calibrated on the lab's hold-out."""
    directory = tmp_path_factory.mktemp("models")
    calibrated_lab_model(directory)
    stateful_lab_model(directory)
    return directory


class Service:
    """Ingest as the readings endpoints run it: one transaction per request."""

    def __init__(self, database: Database, models: Path, *, checkpoint_every: int = 1000) -> None:
        registry = register_models(
            database, load_models(models, loaded_at=T0, loader=default_loader)
        )
        self.database = database
        self.streams = LiveStreams(database, registry, checkpoint_every=checkpoint_every)
        self.metrics = Metrics()

    def create(self, name: str, model: str = "lstm-seed0") -> None:
        with self.database.session() as session:
            streams.create(
                session,
                streams.NewStream(
                    stream_id=name,
                    model_name=model,
                    channels=["value"],
                    sample_period_s=0.1,
                    has_reference=False,
                    detector_overrides={},
                ),
                now=T0,
            )

    def ingest(self, items: Sequence[tuple[str, list[ReadingIn]]]) -> list[IngestOutcome]:
        with self.database.session() as session:
            return ingest(
                session,
                self.streams,
                self.metrics,
                new_readings(list(items)),
                max_future_s=86_400.0,
            )

    def position(self, name: str) -> tuple[int, int | None] | None:
        return self.streams.position(name)

    def checkpoint(self, name: str) -> bytes:
        """The stream's state as its checkpoint would hold it."""
        live = next(live for live in self.streams.live_streams() if live.stream_id == name)
        return live.state.to_bytes(live.recurrence.monitor)


@functools.cache
def lab_values() -> list[float]:
    return [float(x) for x in lab_series().value]


def reading(stream: int, sample: int) -> ReadingIn:
    """Stream i reads the lab record from its own offset; sample 40 of every stream follows a
    pause of a minute (its warm-up restarts), and stream 3 misses sample 30 (a null)."""
    pause = timedelta(seconds=60) if sample >= 40 else timedelta(0)
    value = None if (stream, sample) == (3, 30) else lab_values()[6000 + 37 * stream + sample]
    return ReadingIn(t=T0 + timedelta(milliseconds=100 * sample) + pause, value=value)


def batch(first: int, count: int, stream: int = 0) -> list[ReadingIn]:
    return [reading(stream, sample) for sample in range(first, first + count)]


def residuals(service: Service, name: str, sizes: list[int], first: int = 0) -> list[float]:
    got: list[float] = []
    for size in sizes:
        (outcome,) = service.ingest([(name, batch(first, size))])
        assert outcome.result is not None and outcome.accepted == size
        got += outcome.result.residual.tolist()
        first += size
    return got


SIZES = [100, 7, 1, 1, 250, 13, 1, 300, 50, 1, 1, 1, 30]  # 756 readings


@pytest.mark.parametrize("model", ["lstm-seed0", "lstm-stateful-lab"])
@pytest.mark.parametrize("checkpoint_every", [1, 97, 100_000])
def test_a_stream_restored_from_the_database_continues_exactly(
    database: Database, models: Path, model: str, checkpoint_every: int
) -> None:
    """Its checkpoint and the readings stored after it, run through the recurrence: the
    continuation is bit for bit that of a stream that never stopped."""
    service = Service(database, models, checkpoint_every=checkpoint_every)
    for name in ("p", "q"):
        service.create(name, model)
        residuals(service, name, SIZES)
    service.streams.forget("p")  # as after a restart: only the database remains
    resumed = residuals(service, "p", [5, 1, 40], first=756)
    assert resumed == residuals(service, "q", [5, 1, 40], first=756)
    assert np.isfinite(resumed).all()


def test_streams_fed_together_checkpoint_on_different_requests(
    database: Database, models: Path
) -> None:
    """Twenty streams checkpointed together (a backfill's request, or a shutdown), then fed one
    reading each a request: each writes its checkpoint every `checkpoint_every` readings, but
    no request writes them all (it would stall it)."""
    every = 10
    service = Service(database, models, checkpoint_every=every)
    names = [f"s{i}" for i in range(20)]
    for name in names:
        service.create(name)
    service.ingest([(name, batch(0, 25, stream=i)) for i, name in enumerate(names)])

    def saved() -> dict[str, int]:
        with database.session() as session:
            rows = {name: checkpoints.get(session, name) for name in names}
            return {name: row.sample_count for name, row in rows.items() if row is not None}

    written: list[int] = []
    counts = saved()
    assert set(counts.values()) == {25}
    for sample in range(25, 25 + 3 * every):
        service.ingest([(name, batch(sample, 1, stream=i)) for i, name in enumerate(names)])
        now = saved()
        written.append(sum(now[name] != counts[name] for name in names))
        assert all(sample + 1 - now[name] < every for name in names)  # a replay stays short
        counts = now
    assert sum(written) == 3 * len(names)  # each stream every `every` readings
    assert max(written) < len(names) // 2


def test_a_switched_stream_restored_from_the_database_continues_exactly(
    database: Database, models: Path
) -> None:
    """A switch to another model writes the new state's checkpoint: restored from it, the
    stream goes on as one that never stopped."""
    service = Service(database, models, checkpoint_every=97)
    stateful = service.streams.registry.require("lstm-stateful-lab")
    for name in ("p", "q"):
        service.create(name)
        residuals(service, name, SIZES)
        with database.session() as session:
            switched = handover.switch(service.streams, session, name, Target.trained(stateful))
        assert switched.previous[0] == "lstm-seed0"
    service.streams.forget("p")
    resumed = residuals(service, "p", [5, 1, 40], first=756)
    assert resumed == residuals(service, "q", [5, 1, 40], first=756)
    assert np.isfinite(resumed).all()  # warm at once: forecasts from the first reading
    with database.session() as session:
        assert streams.require(session, "p").model_name == "lstm-stateful-lab"


def test_a_failed_transaction_leaves_no_trace_in_the_live_state(
    database: Database, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = Service(database, models)
    service.create("p")
    residuals(service, "p", [100])
    real_insert = reading_repo.insert_batches

    def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(reading_repo, "insert_batches", fail)
    with pytest.raises(OperationalError):
        service.ingest([("p", batch(100, 10))])
    monkeypatch.setattr(reading_repo, "insert_batches", real_insert)
    assert service.position("p") is None  # dropped: restored from what was committed
    (again,) = service.ingest([("p", batch(100, 10))])  # processed from the old state
    assert again.duplicates == 0 and again.accepted == 10
    assert again.result is not None and again.result.first_sample == 100


def test_a_clean_stop_checkpoints_every_stream_that_moved(database: Database, models: Path) -> None:
    service = Service(database, models)
    service.create("p")
    residuals(service, "p", [50, 30])  # below checkpoint_every (1000): nothing saved yet
    assert service.streams.checkpoint_all() == 1
    assert service.streams.checkpoint_all() == 0  # already saved
    with database.session() as session:
        saved = checkpoints.get(session, "p")
        assert saved is not None and saved.sample_count == 80
        assert streams.require(session, "p").sample_count == 80
    fresh = Service(database, models)  # as at the next start: nothing to replay
    assert fresh.streams.restore_all() == []
    assert fresh.position("p") == (80, reading_repo.micro(reading(0, 79).t))


def test_a_checkpoint_twinwatch_0_1_saved_resumes(database: Database, models: Path) -> None:
    """A checkpoint row of twinwatch 0.1 (state version 1: its window of readings as JSON) is
    restored, not refused: the stream goes on from the readings it had seen."""
    service = Service(database, models)
    service.create("p")
    residuals(service, "p", [80])
    assert service.streams.checkpoint_all() == 1
    live = next(live for live in service.streams.live_streams() if live.stream_id == "p")
    old = twinwatch_0_1(live.state, live.recurrence.monitor, live.recurrence.window)
    with database.session() as session:
        row = checkpoints.get(session, "p")
        assert row is not None
        row.state, row.state_version = old, 1
    fresh = Service(database, models)
    assert fresh.streams.restore_all() == []
    assert fresh.position("p") == (80, reading_repo.micro(reading(0, 79).t))
    fresh.ingest([("p", batch(80, 10))])
    assert fresh.position("p") == (90, reading_repo.micro(reading(0, 89).t))


def test_a_stop_writes_many_streams_a_statement_each_as_it_would_alone(
    database: Database, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams checkpointed together at a stop (here 3 a transaction) are saved as one at a
    time would save them: a restart resumes each exactly, replaying nothing."""
    monkeypatch.setattr(live_module, "SAVED_TOGETHER", 3)
    service = Service(database, models, checkpoint_every=100_000)  # (none due on the way)
    names = [f"s{i}" for i in range(7)]
    for name in names:
        service.create(name, "lstm-stateful-lab")
    service.ingest([(name, batch(0, 60, stream=i)) for i, name in enumerate(names)])
    expected = {name: service.checkpoint(name) for name in names}
    assert service.streams.checkpoint_all() == len(names)
    assert service.streams.checkpoint_all() == 0
    with database.session() as session:
        saved = checkpoints.get_many(session, names)
        assert {name: row.state for name, row in saved.items()} == expected
        assert {streams.require(session, n).sample_count for n in names} == {60}
    fresh = Service(database, models)
    assert fresh.streams.restore_all() == []
    assert {name: fresh.checkpoint(name) for name in names} == expected


def test_a_start_restores_streams_together_exactly_and_names_the_one_that_cannot(
    database: Database, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams restored several at a time (their checkpoints, the readings after them, none
    at all) get the states they had; a bad checkpoint keeps only its own stream out."""
    monkeypatch.setattr(live_module, "RESTORED_TOGETHER", 4)
    service = Service(database, models, checkpoint_every=97)
    kinds = ["lstm-seed0", "lstm-stateful-lab"]
    names = [f"s-{i:02d}" for i in range(11)]
    for i, name in enumerate(names):
        service.create(name, kinds[i % 2])
        if i % 5:  # every fifth has no reading yet
            service.ingest([(name, batch(0, 40 + 31 * i, i))])
    states = {name: service.checkpoint(name) for name in names if service.position(name)}
    with database.session() as session:  # as a checkpoint written by another version
        saved = checkpoints.get(session, "s-07")
        assert saved is not None
        saved.state_version = -1
    fresh = Service(database, models, checkpoint_every=97)
    assert fresh.streams.restore_all() == [
        ("s-07", "stream 's-07' has a checkpoint of another version")
    ]
    for name in names:
        if name == "s-07":
            assert fresh.position(name) is None
        elif name in states:
            assert fresh.checkpoint(name) == states[name]
        else:
            assert fresh.position(name) == (0, None)


def test_unknown_streams_allocate_nothing(database: Database, models: Path) -> None:
    service = Service(database, models)
    service.create("p")
    for attempt in range(3):
        with pytest.raises(NotFoundError, match="stream 'ghost-"):
            service.ingest([("p", batch(attempt, 1)), (f"ghost-{attempt}", batch(0, 1))])
    assert len(service.streams) == 0  # nothing for the ghosts, nor for "p" of a refused request
    service.ingest([("p", batch(0, 1))])
    assert len(service.streams) == 1


def test_a_tick_gives_every_stream_exactly_what_it_gets_alone(
    database: Database, models: Path
) -> None:
    """Streams of two models, one reading each per request (nulls and a pause included), beside
    twins that get the same readings one request each: the same results and states."""
    service = Service(database, models, checkpoint_every=97)
    kinds = ["lstm-seed0", "lstm-stateful-lab"]
    count = 16
    together = [f"tick-{i}" for i in range(count)]
    alone = [f"alone-{i}" for i in range(count)]
    for i in range(count):
        for name in (together[i], alone[i]):
            service.create(name, kinds[i % 2])
            service.ingest([(name, batch(-300, 300, i))])
    for sample in range(60):
        outcomes = service.ingest([(together[i], [reading(i, sample)]) for i in range(count)])
        for i, outcome in enumerate(outcomes):
            (single,) = service.ingest([(alone[i], [reading(i, sample)])])
            assert outcome.result is not None and single.result is not None
            np.testing.assert_array_equal(outcome.result.forecast, single.result.forecast)
            for kind, column in outcome.result.statistics.items():
                np.testing.assert_array_equal(column, single.result.statistics[kind])
            assert [(a.detector, a.opened_sample) for a in outcome.opened] == [
                (a.detector, a.opened_sample) for a in single.opened
            ]
    for i in range(count):
        assert service.checkpoint(together[i]) == service.checkpoint(alone[i])


def test_a_refused_tick_names_the_stream_and_moves_none(database: Database, models: Path) -> None:
    service = Service(database, models)
    names = [f"bad-{i}" for i in range(16)]
    for i, name in enumerate(names):
        service.create(name)
        service.ingest([(name, batch(-5, 5, i))])
    before = [service.position(name) for name in names]

    future = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    future[4] = (names[4], [ReadingIn(t=datetime.now(UTC) + timedelta(days=2), value=1.0)])
    with pytest.raises(DataError) as refused:
        service.ingest(future)
    assert refused.value.detail.startswith("stream 'bad-4': readings[0].t (")
    assert "ahead of the server clock" in refused.value.detail

    older = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    older[7] = (names[7], [reading(7, -10)])  # before its last reading, never accepted
    with pytest.raises(ConflictError) as conflict:
        service.ingest(older)
    assert conflict.value.detail.startswith("stream 'bad-7': readings[0].t (")
    assert "older than the stream's last accepted reading" in conflict.value.detail

    changed = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    changed[2] = (names[2], [ReadingIn(t=reading(2, -1).t, value=123.0)])  # a changed re-send
    with pytest.raises(ConflictError) as conflict:
        service.ingest(changed)
    assert conflict.value.detail.startswith("stream 'bad-2': readings[0] at ")
    assert "accepted before with another value" in conflict.value.detail

    backwards = [(name, [reading(i, 0), reading(i, 1)]) for i, name in enumerate(names)]
    backwards[9] = (names[9], [reading(9, 1), reading(9, 0)])
    with pytest.raises(DataError, match=r"stream 'bad-9': readings\[1\]\.t .* is not after"):
        service.ingest(backwards)

    assert [service.position(name) for name in names] == before  # nothing moved


def test_a_stream_twice_in_one_request_is_refused(database: Database, models: Path) -> None:
    service = Service(database, models)
    service.create("p")
    with pytest.raises(DataError, match="appear more than once"):
        service.ingest([("p", batch(0, 1)), ("p", batch(1, 1))])
