"""A gateway's tick (one new reading for each of many streams) is validated across the streams
at once: every stream must get exactly what it gets alone, and every refusal must be the
per-stream one, naming the stream."""

from __future__ import annotations

import functools
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.errors import ConflictError, DataError
from app.main import register_models
from app.metrics import Metrics
from app.registry import default_loader, load_models
from app.schemas import ReadingIn
from app.storage.db import Database
from app.storage.repositories import streams as stream_repo
from app.streams.engine import QUICK_TICKS, IngestOutcome, StreamEngine
from app.streams.processor import RUN_AHEAD_MIN
from tests.integration.conftest import make_stream
from tests.support.models import lab_series, stateful_lab_model

MODEL = "lstm-stateful-lab"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
STREAMS = 2 * QUICK_TICKS  # enough for the quick path, whichever streams fall back


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    stateful_lab_model(directory, MODEL)
    return directory


def make_engine(
    database: Database,
    models: Path,
    names: list[str],
    overrides: dict[str, dict[str, Any]] | None = None,
) -> StreamEngine:
    registry = load_models(models, loaded_at=T0, loader=default_loader)
    register_models(database, registry)
    with database.session() as session:
        for name in names:
            # The model is registered: no stand-in.
            make_stream(session, name, model=MODEL, detector_overrides=(overrides or {}).get(name))
    return StreamEngine(database, registry, Metrics(), checkpoint_every=97)


@functools.cache
def lab_values() -> list[float]:
    return [float(x) for x in lab_series().value]


def reading(stream: int, sample: int) -> ReadingIn:
    """Stream i reads the lab record from its own offset; sample 40 of every stream comes after
    a long gap (a restart), and stream 3 misses sample 30 (a null)."""
    values = lab_values()
    gap = timedelta(seconds=60) if sample >= 40 else timedelta(0)
    value = None if (stream, sample) == (3, 30) else float(values[6000 + 37 * stream + sample])
    return ReadingIn(t=T0 + timedelta(milliseconds=100 * sample) + gap, value=value)


def test_a_tick_gives_every_stream_what_it_gets_alone(
    database: Database, models: Path, tmp_path: Path
) -> None:
    together = [f"tick-{i}" for i in range(STREAMS)]
    alone = [f"alone-{i}" for i in range(STREAMS)]
    engine = make_engine(database, models, together + alone)
    warm = 300
    for i in range(STREAMS):
        for name in (together[i], alone[i]):
            engine.ingest(name, [reading(i, s) for s in range(-warm, 0)])
    got: dict[str, list[tuple[float, ...]]] = {name: [] for name in together + alone}
    for sample in range(60):
        items = [(together[i], [reading(i, sample)]) for i in range(STREAMS)]
        if sample == 20:  # stream 5 re-sends its last reading with the new one: per stream
            items[5] = (together[5], [reading(5, 19), reading(5, 20)])
        outcomes = engine.ingest_many(items)
        assert outcomes[5].duplicates == (1 if sample == 20 else 0)
        for i in range(STREAMS):
            alone_outcome = engine.ingest(alone[i], [reading(i, sample)])
            for name, outcome in ((together[i], outcomes[i]), (alone[i], alone_outcome)):
                result = outcome.result
                assert result is not None and len(outcome.accepted) == 1
                statistics = tuple(float(column[0]) for column in result.statistics.values())
                got[name].append(
                    (float(result.forecast[0]), float(result.residual[0]), *statistics)
                )
    for i in range(STREAMS):
        # Forecasts of streams stepped together come from one matrix product over the
        # streams: float32 rounding may differ from a stream's own, within 1e-5. The CUSUM
        # adds up increments of order 1 and is clipped at 0, so near 0 its difference is
        # absolute (2e-6 seen on an AVX-512 machine, whose kernels round differently by size).
        actual, expected = np.array(got[together[i]]), np.array(got[alone[i]])
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5, err_msg=together[i])
        assert np.isnan(actual).tolist() == np.isnan(expected).tolist()
        assert engine.position(together[i]) == engine.position(alone[i])
    assert np.isnan(np.array(got[together[3]])[30, 1])  # the null has no residual
    restarted = np.array(got[together[0]])
    assert np.isnan(restarted[40, 0]) and not np.isnan(restarted[39, 0])  # the gap restarted it


def test_a_tick_refuses_a_bad_stream_with_its_own_error(database: Database, models: Path) -> None:
    names = [f"bad-{i}" for i in range(STREAMS)]
    engine = make_engine(database, models, names)
    for i, name in enumerate(names):
        engine.ingest(name, [reading(i, s) for s in range(-5, 0)])
    before = [engine.position(name) for name in names]

    future = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    future[4] = (names[4], [ReadingIn(t=datetime.now(UTC) + timedelta(days=2), value=1.0)])
    with pytest.raises(DataError) as refused:
        engine.ingest_many(future)
    assert refused.value.detail.startswith("stream 'bad-4': readings[0].t (")
    assert "ahead of the server clock" in refused.value.detail

    older = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    older[7] = (names[7], [reading(7, -10)])  # before its last reading, never accepted
    with pytest.raises(ConflictError) as refused:
        engine.ingest_many(older)
    assert refused.value.detail.startswith("stream 'bad-7': readings[0].t (")
    assert "older than the stream's last accepted reading" in refused.value.detail

    changed = [(name, [reading(i, 0)]) for i, name in enumerate(names)]
    changed[2] = (names[2], [ReadingIn(t=reading(2, -1).t, value=123.0)])  # a changed re-send
    with pytest.raises(ConflictError) as refused:
        engine.ingest_many(changed)
    assert refused.value.detail.startswith("stream 'bad-2': readings[0] at ")
    assert "accepted before with another value" in refused.value.detail

    assert [engine.position(name) for name in names] == before  # nothing moved


def test_a_long_batch_refused_after_its_forecasts_started_moves_nothing(
    database: Database, models: Path
) -> None:
    """A batch long enough for the run-ahead (its LSTM runs while a helper thread checks its
    times) that the checks then refuse: nothing moves, and the stream goes on exactly as one
    that never saw it, through long batches the run-ahead bets right on (one of them led by
    re-sends)."""
    engine = make_engine(database, models, ["bet", "plain"])
    for name in ("bet", "plain"):
        engine.ingest(name, [reading(0, s) for s in range(-300, 0)])
    backwards = [reading(0, s) for s in range(100)]
    backwards[70] = reading(0, 10)  # time goes back in the middle
    with pytest.raises(DataError, match=r"readings\[70\]\.t .* is not after"):
        engine.ingest("bet", backwards)
    unknown = [
        *(reading(0, s) for s in range(99)),
        ReadingIn(t=reading(0, 99).t, values={"x": 1.0}),
    ]
    with pytest.raises(DataError, match="unknown channel"):
        engine.ingest("bet", unknown)
    assert engine.position("bet") == engine.position("plain")
    for batch in ([reading(0, s) for s in range(100)], [reading(0, s) for s in range(90, 200)]):
        got = [engine.ingest(name, batch) for name in ("bet", "plain")]
        assert got[0].duplicates == got[1].duplicates
        assert got[0].result is not None and got[1].result is not None
        np.testing.assert_array_equal(got[0].result.residual, got[1].result.residual)
        for kind, column in got[0].result.statistics.items():
            np.testing.assert_array_equal(column, got[1].result.statistics[kind])
    assert engine.position("bet") == engine.position("plain")


def test_a_long_batch_is_checked_in_a_helper_while_its_forecasts_run(
    database: Database, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The time checks of a long batch of a warm stream run in a helper thread, beside its
    forecasts in the request's thread; a short batch is checked where it is."""
    engine = make_engine(database, models, ["long"])
    checked_in: list[threading.Thread] = []
    check = StreamEngine._checked_times

    def recording(self: StreamEngine, *args: Any) -> Any:
        checked_in.append(threading.current_thread())
        return check(self, *args)

    monkeypatch.setattr(StreamEngine, "_checked_times", recording)
    engine.ingest("long", [reading(0, s) for s in range(-300, 0)])  # cold: no run-ahead
    engine.ingest("long", [reading(0, s) for s in range(0, RUN_AHEAD_MIN)])
    engine.ingest("long", [reading(0, s) for s in range(RUN_AHEAD_MIN, RUN_AHEAD_MIN + 5)])
    here = threading.current_thread()
    assert [thread is here for thread in checked_in] == [True, False, True]
    assert checked_in[1].name.startswith("twinwatch-helper")


def test_a_tick_of_streams_configured_apart_steps_each_with_its_own_detectors(
    database: Database, models: Path
) -> None:
    """Streams of one model with different detector settings in one request: each is stepped
    with its own monitor configuration, and opens and closes the alarms it opens alone."""
    together = [f"apart-{i}" for i in range(2 * STREAMS)]
    alone = [f"solo-{i}" for i in range(2 * STREAMS)]
    registry = load_models(models, loaded_at=T0, loader=default_loader)
    point = next(
        d.threshold
        for d in StreamEngine(database, registry, Metrics())
        .processor_for(registry.require(MODEL), {})
        .monitor_config.detectors
        if d.kind == "point"
    )
    sensitive = {"point": {"threshold": point / 10}}  # alarms every few dozen readings
    overrides = {name: sensitive for name in together[1::2] + alone[1::2]}
    engine = make_engine(database, models, together + alone, overrides)
    events: dict[str, list[tuple[str, int, int | None]]] = {n: [] for n in together + alone}

    def record(name: str, outcome: IngestOutcome) -> None:
        events[name] += [(a.detector, a.opened_sample, None) for a in outcome.opened]
        events[name] += [(a.detector, a.opened_sample, a.closed_sample) for a in outcome.closed]

    for i in range(2 * STREAMS):
        for name in (together[i], alone[i]):
            record(name, engine.ingest(name, [reading(i, s) for s in range(-300, 0)]))
    for sample in range(40):
        items = [(name, [reading(i, sample)]) for i, name in enumerate(together)]
        for name, outcome in zip(together, engine.ingest_many(items), strict=True):
            record(name, outcome)
        for i, name in enumerate(alone):
            record(name, engine.ingest(name, [reading(i, sample)]))
    for i in range(2 * STREAMS):
        assert events[together[i]] == events[alone[i]], together[i]
        with database.session() as session:
            views = [
                engine.view(session, stream_repo.require(session, name))
                for name in (together[i], alone[i])
            ]
        assert views[0].active == views[1].active
    # The sensitive streams do alarm, in the ticks too (an event closed or left open there).
    assert sum(len(events[name]) for name in together[1::2]) > sum(
        len(events[name]) for name in together[::2]
    )
    in_ticks = [
        event
        for name in together[1::2]
        for event in events[name]
        if event[1] >= 300 or (event[2] or 0) >= 300
    ]
    assert in_ticks


def test_ticks_from_two_threads_give_what_they_give_one_after_the_other(
    database: Database, models: Path
) -> None:
    """Two gateways posting at once (two worker threads): one computes while the other writes
    and commits; every stream ends where it ends when the requests come one after the other."""
    left = [f"left-{i}" for i in range(STREAMS)]
    right = [f"right-{i}" for i in range(STREAMS)]
    twins = [f"twin-{i}" for i in range(2 * STREAMS)]
    engine = make_engine(database, models, left + right + twins)
    for i, name in enumerate(left + right):
        engine.ingest(name, [reading(i % STREAMS, s) for s in range(-300, 0)])
        engine.ingest(twins[i], [reading(i % STREAMS, s) for s in range(-300, 0)])
    residuals: dict[str, list[float]] = {name: [] for name in left + right + twins}
    failures: list[BaseException] = []

    def gateway(names: list[str]) -> None:
        try:
            for sample in range(30):
                items = [(name, [reading(i, sample)]) for i, name in enumerate(names)]
                for name, outcome in zip(names, engine.ingest_many(items), strict=True):
                    assert outcome.result is not None
                    residuals[name].append(float(outcome.result.residual[0]))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=gateway, args=(names,)) for names in (left, right)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    gateway(twins[:STREAMS])
    gateway(twins[STREAMS:])
    assert not failures, failures
    for name, twin in zip(left + right, twins, strict=True):
        np.testing.assert_allclose(residuals[name], residuals[twin], rtol=1e-5, atol=1e-6)
        assert engine.position(name) == engine.position(twin)
