"""Thresholds that keep learning, bounded: on normal readings they may rise to twice the learned
ones, never fall below them, and a slow fault cannot teach them to accept it."""

from __future__ import annotations

import numpy as np

from app.learning.adapt import MOST_GAIN, revise
from app.learning.learn import LearnedModel, learn
from app.monitoring.detectors import DETECTORS
from app.monitoring.incidents import incident_spans
from app.simulation.faults import Fault, FaultType, inject_faults
from app.simulation.twin import simulate
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising

LEARN = 6000  # ten minutes of the twin at 10 Hz


def micros(count: int) -> np.ndarray:
    return (np.arange(count) * 100_000 + 1_700_000_000_000_000).astype(np.int64)


def thresholds(learned_monitor: object) -> dict[str, list[float]]:
    out = {}
    for detector in learned_monitor.detectors:  # type: ignore[attr-defined]
        if detector.gains is not None:
            out[detector.kind] = [0.0 if g == 0 else 1 / g for g in detector.gains]
        else:
            out[detector.kind] = [detector.threshold]
    return out


def residuals_of(learned: LearnedModel, values: np.ndarray, refs: np.ndarray) -> object:
    recurrence = learned.recurrence()
    return recurrence.advance(
        [recurrence.new_state()], Readings.of_one(micros(len(values)), values, refs), [0.1]
    ).stream(0)


def test_revised_thresholds_stay_between_once_and_twice_the_learned() -> None:
    run = simulate(3, LEARN + 20_000)
    learned = learn(micros(LEARN), run.value[:LEARN], references=run.reference[:LEARN])
    result = residuals_of(learned, run.value, run.reference)
    normal = result.monitored.copy()  # type: ignore[attr-defined]
    normal[:LEARN] = False
    revised = revise(
        learned,
        result.residuals,  # type: ignore[attr-defined]
        run.value[:, None],
        normal=normal,
        missing=np.zeros(len(run.value)),
        reference_gaps=result.reference_gap,  # type: ignore[attr-defined]
    )
    before, after = thresholds(learned.monitor), thresholds(revised)
    assert set(before) == set(after)
    for kind in before:
        for old, new in zip(before[kind], after[kind], strict=True):
            if DETECTORS[kind].direction == "below":  # less sensitive is lower
                assert old / MOST_GAIN <= new <= old + 1e-12
            elif kind != "missing":
                assert old - 1e-12 <= new <= MOST_GAIN * old + 1e-12


def stream_with_revisions(values: np.ndarray, refs: np.ndarray) -> list[tuple[int, int | None]]:
    """Learn, then monitor as the service does, thresholds revised along the way."""
    learned = learn(micros(LEARN), values[:LEARN], references=refs[:LEARN])
    events, revisions = monitor_revising(
        learned, Readings.of_one(micros(len(values)), values, refs), learned_from=LEARN
    )
    assert len(revisions) >= 3  # (each one on normal readings only)
    return incident_spans(events)


def test_a_slow_drift_and_a_gain_change_are_caught_despite_the_revisions() -> None:
    start = LEARN + 3 * 60_000  # after three revisions on normal readings
    for fault in (
        Fault(type=FaultType.DRIFT, start=start, end=start + 30_000, magnitude=1.0),
        Fault(type=FaultType.GAIN, start=start, end=start + 3_000, factor=1.3),
    ):
        run = inject_faults(5, start + 31_000, [fault])
        incidents = stream_with_revisions(run.value, run.reference)
        assert any(a < fault.end and (b is None or b > fault.start) for a, b in incidents), (
            fault,
            incidents,
        )
