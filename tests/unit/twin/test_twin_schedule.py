"""The twin's pacing and time keeping: pure functions of the clock, tested without sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from app.errors import DataError
from app.series import Series
from app.simulation.faults import LAB_FAULTS
from app.twin.schedule import LOOP_GAP_S, Timeline, build_scenario, resume_origin

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_real_time_sends_one_reading_per_period() -> None:
    timeline = Timeline(samples=100, rate_hz=10.0)
    started = 50.0
    assert timeline.due_count(49.9, started) == 0
    assert timeline.due_count(50.0, started) == 1  # the first reading is due at once
    assert timeline.due_count(50.95, started) == 10
    assert timeline.due_count(51.0, started) == 11
    assert timeline.due_count(1e6, started) == 100  # never more than the scenario


def test_speed_compresses_the_wall_clock_but_not_the_timestamps() -> None:
    fast = Timeline(samples=1000, rate_hz=10.0, speed=4.0)
    assert fast.due(40, started=0.0) == pytest.approx(1.0)  # 4 s of machine time in 1 s
    assert fast.due_count(1.0, started=0.0) == 41
    assert fast.timestamp(40, T0) == T0 + timedelta(seconds=4)  # machine time, not wall time


def test_batches_gather_every_due_reading_when_behind_up_to_max_batch() -> None:
    timeline = Timeline(samples=1000, rate_hz=10.0)
    on_time = timeline.next_batch(sent=5, now=0.55, started=0.0, max_batch=100)
    assert on_time == range(5, 6)
    assert timeline.next_batch(sent=6, now=0.55, started=0.0, max_batch=100) == range(6, 6)
    behind = timeline.next_batch(sent=6, now=30.0, started=0.0, max_batch=100)
    assert behind == range(6, 106)  # 295 are due; a batch carries at most 100
    assert timeline.next_batch(sent=106, now=30.0, started=0.0, max_batch=1000) == range(106, 301)


def test_a_looping_timeline_pauses_between_cycles_and_never_batches_across() -> None:
    timeline = Timeline(samples=20, rate_hz=10.0, speed=1.0, loop=True)
    assert timeline.total is None
    assert timeline.machine_time(19) == pytest.approx(1.9)
    assert timeline.machine_time(20) == pytest.approx(2.0 + LOOP_GAP_S)  # the pause
    assert timeline.offset(25) == 5
    # Half-way through the pause: the whole first cycle is due, nothing of the second.
    assert timeline.due_count(2.0 + LOOP_GAP_S / 2, started=0.0) == 20
    late = timeline.next_batch(sent=15, now=1000.0, started=0.0, max_batch=500)
    assert late == range(15, 20)  # stops at the cycle's end, however late
    gap = (timeline.timestamp(20, T0) - timeline.timestamp(19, T0)).total_seconds()
    assert gap > 10 * 0.1  # longer than the service's gap limit: the stream warms up again


def test_reading_number_inverts_timestamp_across_cycles() -> None:
    timeline = Timeline(samples=37, rate_hz=10.0, loop=True)
    for g in (0, 1, 36, 37, 38, 500):
        assert timeline.reading_number(timeline.timestamp(g, T0), T0) == g


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples": 10, "rate_hz": 0.0}, "--rate"),
        ({"samples": 10, "rate_hz": float("nan")}, "--rate"),
        ({"samples": 10, "rate_hz": 10.0, "speed": -1.0}, "--speed"),
        ({"samples": 0, "rate_hz": 10.0}, "at least one sample"),
    ],
)
def test_bad_timelines_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(DataError, match=message):
        Timeline(**kwargs)  # type: ignore[arg-type]


def test_the_lab_scenario_is_the_reference_lab_run(seed0_lab: Series) -> None:
    scenario = build_scenario(0, 6000, 2000, LAB_FAULTS)
    assert (scenario.start, scenario.stop) == (6000, 8000)
    np.testing.assert_allclose(scenario.values[:300], seed0_lab.value[6000:6300], atol=1e-6)
    assert [f.type.value for f in scenario.sent_faults()] == [
        "spike",
        "offset",
        "excitation",
        "stuck",
    ]
    spike = scenario.values[1100] - scenario.references[1100]
    assert spike > 1.0  # the +1.5 spike shows against the healthy reference sensor


def test_a_slice_of_a_longer_run_sends_that_runs_readings() -> None:
    whole = build_scenario(0, 7700, 300, LAB_FAULTS)
    part = build_scenario(0, 7800, 100, LAB_FAULTS, run_length=8000)
    np.testing.assert_array_equal(part.values, whole.values[100:200])
    assert [f.type.value for f in part.sent_faults()] == ["stuck"]
    assert part.fault_at(7850) is not None and part.fault_at(7849) is None


def test_scenarios_refuse_ranges_that_do_not_fit() -> None:
    with pytest.raises(DataError, match="after the 500 samples"):
        build_scenario(0, 0, 500, LAB_FAULTS)  # the lab's faults sit in 7000..7999
    with pytest.raises(DataError, match="--samples"):
        build_scenario(0, 0, 0, [])
    with pytest.raises(DataError, match="run past"):
        build_scenario(0, 7900, 200, [], run_length=8000)


def test_the_clock_resumes_after_readings_the_stream_already_holds() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert resume_origin(now, None, 10.0) == now.replace(microsecond=123000)
    past = now - timedelta(hours=1)
    assert resume_origin(now, past, 10.0) == now.replace(microsecond=123000)
    ahead = now + timedelta(minutes=5)  # an accelerated run left readings in the future
    origin = resume_origin(now, ahead, 10.0)
    assert (origin - ahead).total_seconds() > LOOP_GAP_S
