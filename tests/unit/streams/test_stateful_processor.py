"""The processor with a stateful forecaster, and many streams advanced together."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.linear_ar import LinearAR
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig
from app.monitoring.calibration import HoldOut, calibrate_margins
from app.monitoring.monitor import Monitor
from app.series import Series
from app.streams.processor import (
    RUN_AHEAD_MIN,
    STEADY_TICKS,
    BatchResult,
    StreamProcessor,
    WindowRing,
)
from tests.support.processing import same_events, stream

W = 64
TINY = TrainingConfig(epochs=3, batch_size=4, lr=1e-2, validation=200)


@pytest.fixture(scope="module")
def lab(seed0_lab: Series) -> tuple[StreamProcessor, np.ndarray, np.ndarray]:
    """A small stateful LSTM with the lab's margins, and the lab series from 6000 on."""
    values = seed0_lab.value
    assert seed0_lab.reference is not None
    forecaster = StatefulLSTMForecaster(window=W, hidden=8, sequence=32, training=TINY)
    forecaster.fit(values[:, None], train_end=6000)
    residuals = streamed_residuals(forecaster, values[:7000])
    gaps = values[:7000] - seed0_lab.reference[:7000]
    config = calibrate_margins(HoldOut(residuals[6000:7000], gaps[6000:7000]))
    return StreamProcessor(forecaster, config), values[6000:], seed0_lab.reference[6000:]


def streamed_residuals(forecaster: StatefulLSTMForecaster, values: np.ndarray) -> np.ndarray:
    """The offline form of one stream stepped from its first reading: NaN before W readings."""
    forecasts, _ = forecaster.run(values[:, None])
    residuals = np.full(values.size, np.nan)
    residuals[W:] = values[W:] - forecasts[W - 2 : -1, 0]  # row j: made after reading j + 1
    return residuals


def offline(processor: StreamProcessor, values: np.ndarray, references: np.ndarray):  # type: ignore[no-untyped-def]
    assert processor.stateful is not None
    residuals = streamed_residuals(processor.stateful, values)
    gaps = values - references
    gaps[:W] = np.nan
    monitor = Monitor(processor.monitor_config)
    run = monitor.run(residuals, gaps)
    return residuals, run.events(monitor.open_events())


@pytest.mark.parametrize("size", [1, 7, 100, 2000])
def test_streaming_equals_the_offline_recurrence(lab, size: int) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    expected_residuals, expected_events = offline(processor, values, references)
    state, residuals, events = stream(processor, values, references, size)
    np.testing.assert_allclose(residuals, expected_residuals, rtol=0, atol=1e-5)
    assert np.isnan(residuals[:W]).all()
    assert same_events(events, expected_events, rel=1e-5, abs=1e-5)
    assert {e.detector for e in events} >= {"point", "level"}
    assert state.samples == values.size and state.recurrent is not None


def test_json_checkpoint_continues_identically(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state = processor.new_state()
    processor.advance(state, values[:1234, None], references[:1234])
    restored = processor.restore(json.loads(json.dumps(state.to_json(), allow_nan=False)))
    a = processor.advance(state, values[1234:1300, None], references[1234:1300])
    b = processor.advance(restored, values[1234:1300, None], references[1234:1300])
    np.testing.assert_array_equal(a.residual, b.residual)
    np.testing.assert_array_equal(state.recurrent.h, restored.recurrent.h)  # type: ignore[union-attr]


def test_a_checkpoint_after_one_reading_of_a_run_survives_json(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, _ = lab
    state = processor.new_state()
    processor.advance(state, values[:1, None])  # nothing stepped yet: no forecast pending
    restored = processor.restore(json.loads(json.dumps(state.to_json(), allow_nan=False)))
    assert restored.pending is not None and np.isnan(restored.pending).all()


def test_process_leaves_the_given_state_alone(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:300, None], references[:300])
    before = json.dumps(state.to_json())
    processor.process(state, values[300:301, None], references[300:301])
    processor.process(state, values[300:400, None], references[300:400])
    assert json.dumps(state.to_json()) == before


@pytest.mark.parametrize("size", [1, 50])
def test_a_short_gap_is_imputed_from_the_carried_state(lab, size: int) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    gapped = values[:600].copy()
    gapped[300:305] = np.nan
    state = processor.new_state()
    results = [
        processor.advance(state, gapped[i : i + size, None], references[i : i + size])
        for i in range(0, 600, size)
    ]
    imputed = np.concatenate([r.imputed for r in results])
    monitored = np.concatenate([r.monitored for r in results])
    forecast = np.concatenate([r.forecast for r in results])
    assert imputed[300:305].all() and not np.isnan(forecast[300:305]).any()
    assert not monitored[300 : 305 + W].any() and monitored[305 + W :].all()
    assert not any(r.opened for r in results)


def test_a_long_gap_restarts_the_recurrence(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, _ = lab
    gapped = values[:900].copy()
    gapped[300:320] = np.nan
    state = processor.new_state()
    result = processor.advance(state, gapped[:, None])
    assert np.isnan(result.forecast[310 : 320 + W]).all()
    assert not np.isnan(result.forecast[320 + W :]).any()
    # After the restart the stream is a fresh one started at 320.
    fresh = processor.new_state()
    expected = processor.advance(fresh, values[320:900, None])
    np.testing.assert_allclose(result.residual[320:], expected.residual, atol=1e-6)


def same_result(a: BatchResult, b: BatchResult) -> bool:
    return all(
        np.array_equal(x, y, equal_nan=True)
        for x, y in zip(
            (a.forecast, a.residual, *a.statistics.values()),
            (b.forecast, b.residual, *b.statistics.values()),
            strict=True,
        )
    )


@pytest.mark.parametrize("case", ["as assumed", "time gap", "other readings", "moved on"])
def test_a_run_computed_ahead_is_used_only_for_the_batch_it_assumed(  # type: ignore[no-untyped-def]
    lab, case: str, monkeypatch
) -> None:
    """`run_ahead` bets on a long batch that continues the stream; whatever the batch turns out
    to be, the results are exactly those of a stream that never ran ahead."""
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:300, None], references[:300])
    batch, refs = values[300:500, None], references[300:500]
    restart = np.zeros(200, dtype=bool)
    if case == "time gap":
        restart[120] = True
    ahead = state.copy()
    processor.run_ahead(ahead, batch if case != "other readings" else batch + 1.0)
    assert ahead.ahead is not None
    if case == "moved on":  # another batch came first: its state is not the one bet on
        processor.advance(ahead, batch[:1], refs[:1])
        processor.advance(state, batch[:1], refs[:1])
        batch, refs, restart = batch[1:], refs[1:], restart[1:]
    runs: list[int] = []  # the runs `advance` computes itself from here on
    run = processor.stateful.run
    monkeypatch.setattr(processor.stateful, "run", lambda *a: runs.append(1) or run(*a))
    got = processor.advance(ahead, batch, refs, restart)
    assert (not runs) == (case == "as assumed")
    monkeypatch.undo()
    assert same_result(got, processor.advance(state, batch, refs, restart))
    assert ahead.ahead is None
    assert json.dumps(ahead.to_json()) == json.dumps(state.to_json())


def test_no_run_ahead_for_short_batches_nulls_or_a_cold_stream(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:300, None], references[:300])
    nulls = values[300:400, None].copy()
    nulls[5] = np.nan
    for stream_state, batch in (
        (state, values[300 : 300 + RUN_AHEAD_MIN - 1, None]),
        (state, nulls),
        (processor.new_state(), values[:100, None]),
    ):
        assert not processor.can_run_ahead(stream_state, batch)
        processor.run_ahead(stream_state, batch)
        assert stream_state.ahead is None


@pytest.fixture(scope="module", params=["lstm-stateful", "linear-ar"])
def many(request, lab, seed0_lab: Series) -> StreamProcessor:  # type: ignore[no-untyped-def]
    processor, _, _ = lab
    if request.param == "lstm-stateful":
        return processor
    linear = LinearAR(window=W).fit(seed0_lab.value[:, None], train_end=6000)
    return StreamProcessor(linear, processor.monitor_config)


def test_streams_advanced_together_equal_each_alone(many: StreamProcessor, lab) -> None:  # type: ignore[no-untyped-def]
    """40 streams at different points of the lab record (some warming up, one with a null, one
    after a time gap), one reading each, in one call: the same as one by one."""
    _, values, references = lab
    offsets = [17 * i for i in range(40)]
    together = [many.new_state() for _ in offsets]
    alone = [many.new_state() for _ in offsets]
    rounds = 150
    for k in range(rounds):
        batches = []
        for i, offset in enumerate(offsets):
            value = values[offset + k : offset + k + 1, None].copy()
            if (i, k) == (3, 120):
                value[:] = np.nan
            restart = np.array([(i, k) == (5, 100)])
            batches.append((value, references[offset + k : offset + k + 1], restart))
        joint = many.advance_many([(s, *b) for s, b in zip(together, batches, strict=True)])
        for state, batch, result in zip(alone, batches, joint, strict=True):
            single = many.advance(state, *batch)
            np.testing.assert_allclose(result.residual, single.residual, atol=1e-6)
            assert result.imputed == single.imputed and result.opened == single.opened
    for a, b in zip(together, alone, strict=True):
        assert a.samples == b.samples == rounds
        np.testing.assert_allclose(a.window, b.window, atol=1e-6)  # imputed: float32 rounding
    assert many.warmup_remaining(together[5]) == W - (rounds - 100)


def test_a_tick_as_columns_equals_the_same_tick_as_batches(many: StreamProcessor, lab) -> None:  # type: ignore[no-untyped-def]
    """`advance_tick` (the engine's columns) and `advance_many` (a batch per stream) agree
    exactly, nulls and time gaps included; bad columns are refused before anything moves."""
    _, values, references = lab
    offsets = [13 * i for i in range(20)]
    columns = [many.new_state() for _ in offsets]
    batches = [many.new_state() for _ in offsets]
    for k in range(W + 60):
        tick = np.array([values[o + k] for o in offsets])
        if k == W + 30:
            tick[3] = np.nan
        given = np.array([references[o + k] for o in offsets])
        restart = np.array([(i, k) == (5, W + 20) for i in range(len(offsets))])
        by_columns = many.advance_tick(columns, tick, given, restart)
        by_batches = many.advance_many(
            [
                (state, tick[i : i + 1, None], given[i : i + 1], restart[i : i + 1])
                for i, state in enumerate(batches)
            ]
        )
        for a, b in zip(by_columns, by_batches, strict=True):
            np.testing.assert_array_equal(a.residual, b.residual)
            assert a.statistics.keys() == b.statistics.keys()
            for kind in a.statistics:
                np.testing.assert_array_equal(a.statistics[kind], b.statistics[kind])
            assert (a.opened, a.closed, a.open_events) == (b.opened, b.closed, b.open_events)
    assert [s.to_json() for s in columns] == [s.to_json() for s in batches]
    before = [s.to_json() for s in columns]
    for bad in (
        dict(values=np.zeros(19)),
        dict(values=np.full(20, np.inf)),
        dict(values=np.zeros(20), references=np.zeros(3)),
        dict(values=np.zeros(20), restart=np.zeros(2, dtype=bool)),
    ):
        with pytest.raises(DataError):
            many.advance_tick(columns, **bad)
    assert [s.to_json() for s in columns] == before


def test_a_window_ring_moves_like_a_copied_window() -> None:
    window = np.arange(5.0)[:, None]
    ring = WindowRing.of(window)
    for value in range(5, 40):  # wraps every 5 readings
        expected = np.concatenate([window[1:], [[float(value)]]])
        window = ring.push(np.array([float(value)]))
        np.testing.assert_array_equal(window, expected)


def test_steady_ticks_past_the_rings_wrap_equal_one_batch_per_stream(
    many: StreamProcessor, lab
) -> None:  # type: ignore[no-untyped-def]
    """Stepped tick by tick for three windows (the steady path's ring wraps, a null and a time
    gap send streams off it and back), the streams end exactly where a batch each leaves them."""
    _, values, references = lab
    offsets = [29 * i for i in range(STEADY_TICKS + 2)]
    ticked = [many.new_state() for _ in offsets]
    ticks = 3 * W + 10
    gaps = np.zeros((len(offsets), ticks), dtype=bool)
    gaps[1, 2 * W] = True
    series = np.array([values[o : o + ticks] for o in offsets])
    series[2, W + 40] = np.nan
    for k in range(ticks):
        many.advance_tick(ticked, series[:, k], references[: len(offsets)] * 0 + np.nan, gaps[:, k])
    for i, state in enumerate(ticked):
        alone = many.new_state()
        many.advance(alone, series[i][:, None], None, gaps[i])
        np.testing.assert_array_equal(state.window, alone.window)  # what the ring holds
        assert (state.imputed.tolist(), state.samples) == (alone.imputed.tolist(), alone.samples)
        # The rest went through other kernels (a step per tick, a run per batch): float32
        # rounding apart.
        assert state.last_forecast == pytest.approx(alone.last_forecast, abs=1e-6)
        if state.recurrent is not None and alone.recurrent is not None:
            np.testing.assert_allclose(state.recurrent.h, alone.recurrent.h, rtol=0, atol=1e-6)
