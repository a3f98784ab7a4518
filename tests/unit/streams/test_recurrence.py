"""The stream recurrence: one implementation for ticks, batches, replays and offline records,
exact whatever the grouping, and the rule for missing readings and gaps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig
from app.monitoring.alarms import AlarmEvent
from app.monitoring.calibration import HoldOut, calibrate_margins
from app.monitoring.config import MISSING_READINGS, MonitorConfig, PointConfig
from app.monitoring.evaluation import stream_record
from app.series import Series
from app.streams.blocks import Readings, StreamResult
from app.streams.recurrence import Recurrence
from app.streams.saved import SavedState
from tests.support.checkpoints import twinwatch_0_1

PERIOD = 0.1
T0 = 1_700_000_000_000_000  # microseconds


def times(start: int, stop: int) -> np.ndarray:
    return T0 + np.arange(start, stop, dtype=np.int64) * 100_000


def make_forecaster(kind: str, series: Series) -> Forecaster:
    values = series.value[:, None]
    if kind == "naive":
        return Naive(window=16)
    if kind == "linear-ar":
        return LinearAR(window=64).fit(values, train_end=6000)
    tiny = TrainingConfig(epochs=2, batch_size=4, lr=1e-2, validation=200)
    return StatefulLSTMForecaster(window=64, hidden=8, sequence=32, training=tiny).fit(
        values, train_end=6000
    )


@pytest.fixture(scope="module", params=["naive", "linear-ar", "lstm-stateful"])
def recurrence(request: pytest.FixtureRequest, seed0_lab: Series) -> Recurrence:
    """A forecaster of each way of forecasting, with thresholds from a hold-out of the lab."""
    forecaster = make_forecaster(request.param, seed0_lab)
    watch = MonitorConfig(detectors=[PointConfig(threshold=1e300)])
    record = stream_record(
        forecaster, watch, seed0_lab.head(7000), ["value"], sample_period_s=PERIOD
    )
    config = calibrate_margins(HoldOut(record.inputs, record.reference_gaps, 6000, 7000))
    return Recurrence(forecaster, config)


@dataclass
class Lab:
    values: np.ndarray  # the lab record from 6000 on, a few nulls and a pause in it
    references: np.ndarray
    times: np.ndarray


@pytest.fixture(scope="module")
def lab(seed0_lab: Series) -> Lab:
    assert seed0_lab.reference is not None
    values = seed0_lab.value[6000:].copy()
    values[300] = np.nan  # imputed
    values[500:503] = np.nan  # imputed
    values[700:720] = np.nan  # too many in a row: the warm-up restarts
    stamps = times(6000, 8000)
    stamps[1200:] += 5_000_000  # a 5 s pause: the warm-up restarts
    return Lab(values, seed0_lab.reference[6000:].copy(), stamps)


def advance(
    recurrence: Recurrence, states: list, lab: Lab, parts: list[tuple[int, int, int]]
) -> list[StreamResult]:
    """One block: stream s's readings [a, b) for each (s, a, b) of `parts`."""
    readings = Readings(
        np.array([b - a for _, a, b in parts]),
        np.concatenate([lab.times[a:b] + s for s, a, b in parts]),
        np.concatenate([lab.values[a:b] for _, a, b in parts])[:, None],
        np.concatenate([lab.references[a:b] for _, a, b in parts]),
    )
    block = recurrence.advance([states[s] for s, _, _ in parts], readings, [PERIOD] * len(parts))
    return [block.stream(i) for i in range(len(parts))]


def groupings(streams: int, count: int, seed: int) -> Iterator[tuple[str, list]]:
    """Ways of cutting `streams` streams of `count` readings into blocks."""
    yield "whole", [[(s, 0, count) for s in range(streams)]]
    yield "ticks", [[(s, t, t + 1) for s in range(streams)] for t in range(count)]
    rng = np.random.default_rng(seed)
    blocks, position = [], [0] * streams
    while min(position) < count:
        block = []
        for s in range(streams):
            if position[s] < count and rng.random() < 0.6:
                stop = min(count, position[s] + int(rng.integers(1, 120)))
                block.append((s, position[s], stop))
                position[s] = stop
        if block:
            blocks.append(block)
    yield "ragged", blocks


Outcome = tuple[dict[str, np.ndarray], list[AlarmEvent], list[bytes]]


def run(recurrence: Recurrence, lab: Lab, blocks: list, streams: int) -> list[Outcome]:
    states = [recurrence.new_state() for _ in range(streams)]
    columns: list[dict[str, list[np.ndarray]]] = [{} for _ in range(streams)]
    events: list[list[AlarmEvent]] = [[] for _ in range(streams)]
    for parts in blocks:
        for (s, _, _), result in zip(parts, advance(recurrence, states, lab, parts), strict=True):
            for name, values in [
                ("forecast", result.forecast),
                ("residual", result.residual),
                ("monitored", result.monitored),
                *result.statistics.items(),
            ]:
                columns[s].setdefault(name, []).append(values)
            events[s] += result.opened + result.closed
    return [
        (
            {name: np.concatenate(parts) for name, parts in columns[s].items()},
            sorted(events[s], key=repr),
            [states[s].to_bytes(recurrence.monitor)],
        )
        for s in range(streams)
    ]


def test_any_grouping_of_streams_and_readings_gives_the_same_bits(
    recurrence: Recurrence, lab: Lab
) -> None:
    """Whole records, gateway ticks and ragged blocks of several streams: the same forecasts,
    residuals, statistics, alarms and checkpoints, exactly (nulls and a pause included)."""
    streams, count = 3, 1500
    outcomes = {
        name: run(recurrence, lab, blocks, streams) for name, blocks in groupings(streams, count, 0)
    }
    reference = outcomes.pop("whole")
    for name, outcome in outcomes.items():
        for stream, (columns, events, state) in enumerate(outcome):
            expected_columns, expected_events, expected_state = reference[stream]
            for column, values in columns.items():
                assert np.array_equal(values, expected_columns[column], equal_nan=True), (
                    f"{name}: stream {stream}'s {column}"
                )
            assert events == expected_events, name
            assert state == expected_state, name
    assert any(reference[0][1])  # the lab's faults do raise alarms


def whole_stream(recurrence: Recurrence, lab: Lab, stop: int) -> StreamResult:
    return advance(recurrence, [recurrence.new_state()], lab, [(0, 0, stop)])[0]


def test_no_forecast_and_no_alarm_while_warming_up(recurrence: Recurrence, lab: Lab) -> None:
    result = whole_stream(recurrence, lab, 299)
    window = recurrence.window
    assert np.isnan(result.forecast[:window]).all() and not result.monitored[:window].any()
    assert np.isfinite(result.forecast[window:]).all()


def test_a_short_run_of_nulls_is_imputed_and_raises_no_alarm(
    recurrence: Recurrence, lab: Lab
) -> None:
    result = whole_stream(recurrence, lab, 700)
    window = recurrence.window
    for start, stop in ((300, 301), (500, 503)):
        assert result.imputed[start:stop].all()
        assert np.isfinite(result.forecast[start:stop]).all()  # the imputed value
        assert np.isnan(result.residual[start:stop]).all()
        # A window holding an imputed reading reaches no detector.
        assert not result.monitored[start : stop + window].any()
    assert result.monitored[503 + window : 700].all()


def test_more_nulls_in_a_row_than_allowed_restart_the_warm_up(
    recurrence: Recurrence, lab: Lab
) -> None:
    result = whole_stream(recurrence, lab, 1100)
    window, gap = recurrence.window, recurrence.max_gap
    assert result.imputed[700 : 700 + gap].all() and not result.imputed[700 + gap : 720].any()
    assert np.isnan(result.forecast[700 + gap : 720 + window]).all()
    assert np.isfinite(result.forecast[720 + window : 1100]).all()


def test_a_null_while_warming_up_restarts_it(recurrence: Recurrence, lab: Lab) -> None:
    state = recurrence.new_state()
    nulls = Lab(lab.values.copy(), lab.references, lab.times)
    nulls.values[10] = np.nan
    (result,) = advance(recurrence, [state], nulls, [(0, 0, 200)])
    assert not result.imputed.any()
    assert recurrence.warmup_remaining(state) == max(0, recurrence.window - (200 - 11))


def test_a_pause_restarts_the_warm_up(recurrence: Recurrence, lab: Lab) -> None:
    result = advance(recurrence, [recurrence.new_state()], lab, [(0, 900, 1200 + 300)])[0]
    window = recurrence.window
    assert np.isnan(result.forecast[300 : 300 + window]).all()  # readings 1200.. follow a pause
    assert np.isfinite(result.forecast[300 + window :]).all()


def test_a_checkpoint_continues_exactly(recurrence: Recurrence, lab: Lab) -> None:
    state = recurrence.new_state()
    advance(recurrence, [state], lab, [(0, 0, 1234)])
    saved = state.to_bytes(recurrence.monitor)
    restored = recurrence.restore(saved, state.last_time)
    a = advance(recurrence, [state], lab, [(0, 1234, 2000)])[0]
    b = advance(recurrence, [restored], lab, [(0, 1234, 2000)])[0]
    np.testing.assert_array_equal(a.residual, b.residual)
    assert a.opened == b.opened and a.closed == b.closed
    assert state.to_bytes(recurrence.monitor) == restored.to_bytes(recurrence.monitor)


def test_bad_input_changes_nothing(recurrence: Recurrence, lab: Lab) -> None:
    state = recurrence.new_state()
    advance(recurrence, [state], lab, [(0, 0, 100)])
    before = state.to_bytes(recurrence.monitor)
    for values, error in (
        (np.array([[1.0], [np.inf]]), "finite"),
        (np.array([[1.0, 2.0], [3.0, 4.0]]), "channel"),
    ):
        with pytest.raises(DataError, match=error):
            recurrence.advance([state], Readings.of_one(times(100, 102), values), [PERIOD])
    with pytest.raises(DataError, match="references must be finite"):
        recurrence.advance(
            [state],
            Readings.of_one(times(100, 101), np.array([1.0]), np.array([np.inf])),
            [PERIOD],
        )
    assert state.to_bytes(recurrence.monitor) == before


def test_forecast_ahead_needs_a_warm_stream(recurrence: Recurrence, lab: Lab) -> None:
    state = recurrence.new_state()
    with pytest.raises(DataError, match=f"warming up: {recurrence.window} more"):
        recurrence.forecast_ahead(state, 1)
    advance(recurrence, [state], lab, [(0, 0, 280)])
    ahead = recurrence.forecast_ahead(state, 1)
    assert ahead.shape == (1,)
    (following,) = advance(recurrence, [state], lab, [(0, 280, 281)])
    assert following.forecast[0] == ahead[0]  # what the next reading is compared with
    with pytest.raises(DataError, match="horizon"):
        recurrence.forecast_ahead(state, 2)


def test_restore_refuses_a_state_it_cannot_continue(recurrence: Recurrence) -> None:
    blob = recurrence.new_state().to_bytes(recurrence.monitor)
    carry = recurrence.forecaster.carry_size
    for change, error in (
        ({"carry": np.ones(carry + 1, np.float32)}, "carry"),
        ({"history": np.ones(recurrence.forecaster.context + 1)}, "history"),
        ({"run": -1}, "counters"),
        ({"monitor_values": np.ones(0), "rules": {}}, "monitor state"),
        ({"latest": np.full(2, np.inf)}, "latest"),
    ):
        parts = SavedState.from_bytes(blob)
        for name, value in change.items():
            setattr(parts, name, value)
        with pytest.raises(DataError, match=error):
            recurrence.restore(parts.to_bytes(), None)
    for broken, error in ((blob[:-3], "cut short"), (blob + b"x", "after its end")):
        with pytest.raises(DataError, match=error):
            recurrence.restore(broken, None)
    with pytest.raises(DataError, match="version"):
        recurrence.restore(b'{"version": 99}', None)


def test_a_checkpoint_of_the_json_layout_before_still_resumes(
    recurrence: Recurrence, lab: Lab
) -> None:
    """A release before wrote checkpoints as JSON: a stream saved then resumes the same."""
    state = recurrence.new_state()
    advance(recurrence, [state], lab, [(0, 0, 700)])
    monitor = recurrence.monitor

    def numbers(array: np.ndarray) -> list[float | None]:
        return [None if np.isnan(x) else float(x) for x in np.ravel(array)]

    legacy = {
        "version": 2,
        "samples": state.samples,
        "run": state.run,
        "since_imputed": state.since_imputed,
        "missing_run": state.missing_run,
        "history": numbers(state.history),
        "carry": numbers(state.carry.astype(np.float64)),
        "pending": numbers(state.pending),
        "monitor": monitor.state_to_json(state.monitor),
        "latest": numbers(state.latest),
        "held": state.held,
    }
    resumed = recurrence.restore(json.dumps(legacy).encode(), state.last_time)
    assert resumed.to_bytes(monitor) == state.to_bytes(monitor)


def test_a_state_saved_under_other_detectors_resumes_with_them_afresh(
    recurrence: Recurrence, lab: Lab
) -> None:
    """A checkpoint written before the stream's detectors changed (a detector turned off, or
    the missing-readings rule a release adds to trained models): the forecaster's state carries
    on, the detectors start afresh, nothing is refused."""
    state = recurrence.new_state()
    advance(recurrence, [state], lab, [(0, 0, 400)])
    saved = state.to_bytes(recurrence.monitor)
    config = recurrence.monitor.config
    kinds = [d.kind for d in config.detectors]
    other = [d for d in config.detectors if d.kind != kinds[0]] + [MISSING_READINGS]
    changed = Recurrence(recurrence.forecaster, config.model_copy(update={"detectors": other}))
    with pytest.raises(DataError):
        changed.restore(saved, state.last_time)
    resumed = changed.restore(saved, state.last_time, fresh_monitor=True)
    assert resumed.samples == 400
    np.testing.assert_array_equal(resumed.history, state.history)
    np.testing.assert_array_equal(resumed.latest[:2], state.latest[:2])
    assert np.isnan(resumed.latest[2:]).all()
    (result,) = advance(changed, [resumed], lab, [(0, 400, 500)])
    (expected,) = advance(recurrence, [state], lab, [(0, 400, 500)])
    np.testing.assert_array_equal(result.forecasts, expected.forecasts)


def test_a_checkpoint_of_twinwatch_0_1_still_resumes(recurrence: Recurrence, lab: Lab) -> None:
    """twinwatch 0.1 saved a window of readings and a flag per reading for the imputed ones: a
    stream saved then resumes with that window as its history (it was refused once the layout
    after it got a new version number)."""
    state = recurrence.new_state()
    advance(recurrence, [state], lab, [(0, 0, 700)])
    monitor = recurrence.monitor
    window = state.history[-recurrence.window :]
    saved = twinwatch_0_1(state, monitor, recurrence.window, last_forecast=0.1, last_residual=0.2)
    resumed = recurrence.restore(saved, state.last_time)
    assert resumed.samples == state.samples
    assert resumed.run == min(len(window), recurrence.window)  # (the readings it kept)
    np.testing.assert_array_equal(resumed.history[-len(window) :], window)
    again = recurrence.restore(resumed.to_bytes(monitor), state.last_time)
    assert again.to_bytes(monitor) == resumed.to_bytes(monitor)
