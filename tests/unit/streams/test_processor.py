from __future__ import annotations

import json

import numpy as np
import pytest

from app.errors import DataError
from app.forecasting.linear_ar import LinearAR
from app.monitoring.calibration import HoldOut, calibrate_margins
from app.monitoring.monitor import Monitor, MonitorConfig
from app.monitoring.residuals import one_step_residuals
from app.series import Series
from app.streams.processor import StreamProcessor, StreamState
from tests.support.processing import same_events, stream

W = 64


@pytest.fixture(scope="module")
def lab(seed0_lab: Series) -> tuple[StreamProcessor, np.ndarray, np.ndarray]:
    """A linear AR (quick, deterministic) with the lab's margins, and the series from 6000 on."""
    values = seed0_lab.value
    assert seed0_lab.reference is not None
    forecaster = LinearAR(window=W).fit(values[:, None], train_end=6000)
    residuals = one_step_residuals(forecaster, values[:, None])
    gaps = values - seed0_lab.reference
    config = calibrate_margins(HoldOut(residuals[6000:7000], gaps[6000:7000]))
    return StreamProcessor(forecaster, config), values[6000:], seed0_lab.reference[6000:]


def offline(processor: StreamProcessor, values: np.ndarray, references: np.ndarray):  # type: ignore[no-untyped-def]
    residuals = one_step_residuals(processor.forecaster, values[:, None])
    gaps = values - references
    gaps[:W] = np.nan  # nothing reaches the monitor before the window is warm
    monitor = Monitor(processor.monitor_config)
    run = monitor.run(residuals, gaps)
    return residuals, run.events(monitor.open_events())


@pytest.mark.parametrize("size", [1, 7, 100, 2000])
def test_batches_equal_the_offline_evaluation(lab, size: int) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    expected_residuals, expected_events = offline(processor, values, references)
    state, residuals, events = stream(processor, values, references, size)
    np.testing.assert_allclose(residuals, expected_residuals, rtol=0, atol=1e-9)
    assert same_events(events, expected_events)
    assert {e.detector for e in events} >= {"point", "rolling_rms", "variance_floor", "level"}
    assert state.samples == values.size


def test_no_forecast_and_no_alarm_while_warming_up(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    noisy = values[:W].copy()
    noisy[::2] += 5.0  # wild readings, and a reference they disagree with
    state, result = processor.process(processor.new_state(), noisy[:, None], references[:W])
    assert np.isnan(result.forecast).all() and not result.monitored.any()
    assert not result.opened and all(np.isnan(s).all() for s in result.statistics.values())
    assert processor.warmup_remaining(state) == 0


def test_state_survives_json_and_continues_identically(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:1234, None], references[:1234])
    saved = json.loads(state.to_bytes())  # the checkpoint as the engine writes it
    assert saved == json.loads(json.dumps(state.to_json()))  # every float exact
    restored = processor.restore(saved)
    _, a = processor.process(state, values[1234:, None], references[1234:])
    _, b = processor.process(restored, values[1234:, None], references[1234:])
    np.testing.assert_array_equal(a.residual, b.residual)
    assert a.opened == b.opened and a.closed == b.closed


def test_a_state_with_a_non_finite_number_is_not_checkpointed(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:100, None], references[:100])
    state.last_residual = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        state.to_bytes()


def test_process_never_mutates_the_state_it_is_given(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    state, _ = processor.process(processor.new_state(), values[:500, None], references[:500])
    before = json.dumps(state.to_json())
    processor.process(state, values[500:900, None], references[500:900])
    assert json.dumps(state.to_json()) == before


def test_short_gap_is_imputed_and_raises_no_alarm(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    clean = values[:900].copy()
    gapped = clean.copy()
    gapped[500:505] = np.nan
    _, result = processor.process(processor.new_state(), gapped[:, None], references[:900])
    assert result.imputed[500:505].all() and not np.isnan(result.forecast[500:505]).any()
    # Windows holding an imputed value reach no detector; the rest are monitored as usual.
    assert not result.monitored[500 : 505 + W].any()
    assert result.monitored[505 + W :].all()
    assert not result.opened


def test_long_gap_restarts_the_warm_up(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    gapped = values[:900].copy()
    gapped[300:320] = np.nan  # 20 nulls > max_gap
    state, result = processor.process(processor.new_state(), gapped[:, None], references[:900])
    assert result.imputed[300:310].all() and not result.imputed[310:320].any()
    assert np.isnan(result.forecast[310 : 320 + W]).all()
    assert not np.isnan(result.forecast[320 + W :]).any()
    assert not result.opened
    assert processor.warmup_remaining(state) == 0


def test_time_gap_restarts_the_warm_up(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, references = lab
    restart = np.zeros(300, dtype=bool)
    restart[200] = True
    _, result = processor.process(
        processor.new_state(), values[:300, None], references[:300], restart
    )
    assert np.isnan(result.forecast[200 : 200 + W]).all()
    assert not np.isnan(result.forecast[200 + W :]).any()


def test_infinite_readings_are_refused(lab) -> None:  # type: ignore[no-untyped-def]
    processor, _, _ = lab
    with pytest.raises(DataError, match="finite"):
        processor.process(processor.new_state(), np.array([[np.inf]]))


def test_forecast_ahead_needs_a_warm_window(lab) -> None:  # type: ignore[no-untyped-def]
    processor, values, _ = lab
    state = processor.new_state()
    with pytest.raises(DataError, match="warming up: 64 more"):
        processor.forecast_ahead(state, 1)
    state, _ = processor.process(state, values[:100, None])
    assert processor.forecast_ahead(state, 1).shape == (1,)
    with pytest.raises(DataError, match="horizon"):
        processor.forecast_ahead(state, 2)


def test_restore_refuses_a_state_of_another_shape(lab) -> None:  # type: ignore[no-untyped-def]
    processor, _, _ = lab
    state: StreamState = processor.new_state()
    saved = state.to_json()
    saved["version"] = 99
    with pytest.raises(DataError, match="version"):
        processor.restore(saved)
    assert isinstance(processor.monitor_config, MonitorConfig)
