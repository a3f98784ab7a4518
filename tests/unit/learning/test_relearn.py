"""Relearning's pure core (app/learning/relearn.py): when it is due, which readings teach, the
guard against a slow fault, and the proof a candidate must pass to take over."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.errors import DataError
from app.learning.learn import DAY_S, WEEK_S, LearnedModel, learn
from app.learning.relearn import (
    DriftError,
    RelearnPlan,
    drift,
    normal_readings,
    relearned_from_history,
    verdict,
)
from app.monitoring.alarms import AlarmEvent
from app.monitoring.incidents import QUIET_TO_JOIN, alarm_spans
from app.simulation import Fault, FaultType, inject_faults, simulate
from app.simulation.twin import TwinRun
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising
from app.streams.recurrence import Recurrence
from app.streams.shadow import Run, run

LEARNING = 4000
HISTORY = 24_000  # readings after the learning ones
FAULT_FROM = LEARNING + HISTORY // 2
LATE_FAULT = LEARNING + HISTORY - 3000  # (the readings of an open alarm run one at a time)


def _times(count: int) -> np.ndarray:
    return (1_700_000_000_000_000 + np.arange(count) * 100_000).astype(np.int64)


def _readings(twin: TwinRun) -> Readings:
    count = twin.value.shape[0]
    return Readings.of_one(_times(count), twin.value[:, None], twin.reference)


def _learned(twin: TwinRun) -> LearnedModel:
    return learn(_times(LEARNING), twin.value[:LEARNING], references=twin.reference[:LEARNING])


def test_relearning_is_due_at_a_day_and_a_week_of_history_then_weekly() -> None:
    plan = RelearnPlan()
    assert plan.next_at(None) == DAY_S
    assert plan.next_at(DAY_S) == WEEK_S
    assert plan.next_at(1.5 * DAY_S) == WEEK_S
    assert plan.next_at(WEEK_S + 600) == 2 * WEEK_S + 600
    assert RelearnPlan(after_s=(), every_s=3600).next_at(None) == 3600
    assert RelearnPlan(after_s=(600,), every_s=None).next_at(600) is None


def test_a_stream_s_plan_comes_from_its_learning_configuration() -> None:
    assert RelearnPlan.of(None) == RelearnPlan.of({"readings": 1000}) == RelearnPlan()
    assert RelearnPlan.of({"readings": 1000, "relearn": False}) is None
    plan = RelearnPlan.of({"relearn": {"after_s": [3600], "every_s": None, "proving_s": 600}})
    assert plan == RelearnPlan(after_s=(3600.0,), every_s=None, proving_s=600.0)


def test_readings_under_an_alarm_and_its_quiet_spell_never_teach() -> None:
    normal = normal_readings(200, [(10, 20), (150, None)])
    assert normal[:10].all() and not normal[10 : 20 + QUIET_TO_JOIN].any()
    assert normal[20 + QUIET_TO_JOIN : 150].all() and not normal[150:].any()
    # Alarms before the first reading given (a retention period removed their readings).
    assert normal_readings(100, [(-100, -50), (-10, -5)]).sum() == 100 - (QUIET_TO_JOIN - 5)
    assert normal_readings(100, [(-100, -50)]).all()


def test_learning_leaves_out_the_readings_it_is_told_are_not_normal() -> None:
    twin = simulate(3, 8000)
    wild = twin.value.copy()
    wild[5000:6000] += np.random.default_rng(0).normal(0, 5, 1000)  # a fault's readings
    normal = normal_readings(8000, [(5000, 6000)])
    times = _times(8000)
    clean = learn(times, np.where(normal, twin.value, np.nan))
    masked = learn(times, wild, normal=normal)
    taught = learn(times, wild)
    assert masked.fits == clean.fits
    assert masked.scales[0].scale == pytest.approx(clean.scales[0].scale, rel=0.05)
    assert taught.scales[0].scale > 3 * clean.scales[0].scale


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_normal_history_may_teach(seed: int) -> None:
    twin = simulate(seed, LEARNING + HISTORY)
    learned = _learned(twin)
    candidate = relearned_from_history(
        learned, _readings(twin), covered=[], false_alarms_per_day=1.0, lstm=False
    )
    assert candidate.readings == LEARNING + HISTORY


def _relearned_on(twin: TwinRun) -> LearnedModel:
    """What a stream that learned from the twin's first readings relearns on all of them, its
    alarms' readings left out as the service leaves them out (DriftError if it refuses)."""
    learned = _learned(twin)
    readings = _readings(twin)
    events, _ = monitor_revising(learned, readings, learned_from=LEARNING)
    covered = [(start, stop) for _, start, stop in alarm_spans(events)]
    return relearned_from_history(
        learned, readings, covered=covered, false_alarms_per_day=1.0, lstm=False
    )


def test_a_history_under_a_slow_drift_does_not_teach() -> None:
    # It stays under the running model's level threshold: no alarm leaves it out.
    fault = Fault(type=FaultType.DRIFT, start=FAULT_FROM, end=LEARNING + HISTORY, magnitude=0.1)
    with pytest.raises(DriftError, match="slow fault may be under way") as raised:
        _relearned_on(inject_faults(4, LEARNING + HISTORY, [fault]))
    assert isinstance(raised.value, DataError)  # (a job fails with it, saying why)


@pytest.mark.parametrize(
    "fault",
    [
        Fault(type=FaultType.DRIFT, start=LATE_FAULT, end=LEARNING + HISTORY, magnitude=1.0),
        Fault(type=FaultType.GAIN, start=LATE_FAULT, end=LEARNING + HISTORY, factor=1.1),
        Fault(type=FaultType.OFFSET, start=LATE_FAULT, end=LEARNING + HISTORY, magnitude=0.5),
    ],
    ids=lambda fault: fault.type.value,
)
def test_a_model_relearned_during_a_fault_still_sees_it(fault: Fault) -> None:
    """The running model's alarms covered the fault: the candidate learned without its
    readings (the guard had nothing to refuse) and alarms on them as the running model did."""
    twin = inject_faults(4, LEARNING + HISTORY + 2000, [fault])
    until = LEARNING + HISTORY
    part = TwinRun(
        twin.displacement[:until], twin.value[:until], twin.reference[:until], twin.sample_period_s
    )
    candidate = _relearned_on(part)
    # The fault goes on after the relearning: the candidate, switched in, alarms on it.
    after = run(
        candidate.recurrence(), _readings(twin), candidate.sample_period_s, start=0, skip=until
    )
    assert any(event.start >= until for event in after.events), after.events


def test_the_guard_reads_the_forecast_errors_where_there_is_no_reference() -> None:
    rng = np.random.default_rng(5)
    count = 24_000
    residuals = rng.normal(0, 1, (count, 1)) * np.linspace(1.0, 1.6, count)[:, None]
    normal = np.ones(count, dtype=bool)
    assert "forecast errors grew" in str(drift(residuals, None, normal, level_threshold=None))
    steady = rng.normal(0, 1, (count, 1))
    assert drift(steady, None, normal, level_threshold=None) is None


def _biased(model: LearnedModel, bias: float) -> LearnedModel:
    """The same model with a constant error in its forecasts: a deliberately worse one."""
    fits = [dataclasses.replace(fit, intercept=fit.intercept + bias) for fit in model.fits]
    return dataclasses.replace(model, fits=fits)


def test_a_worse_candidate_is_never_promoted_and_a_better_one_is() -> None:
    twin = simulate(6, LEARNING + 8000)
    readings = _readings(twin)
    learned = _learned(twin)
    period = learned.sample_period_s
    running = run(learned.recurrence(), readings, period, start=0, skip=LEARNING)
    worse = _biased(learned, 0.3)
    assert worse.fits[0].kind == learned.fits[0].kind
    against_worse = verdict(
        running, run(worse.recurrence(), readings, period, start=0, skip=LEARNING)
    )
    assert not against_worse.promoted, against_worse
    assert "not clearly below" in against_worse.reason
    # The running model beside itself is no better either: a tie keeps what runs.
    assert not verdict(running, running).promoted
    better = verdict(
        run(
            Recurrence(worse.forecaster, learned.monitor), readings, period, start=0, skip=LEARNING
        ),
        running,
    )
    assert better.promoted, better
    assert better.candidate_rmse is not None and better.running_rmse is not None
    assert better.candidate_rmse < better.running_rmse


def test_a_candidate_that_raises_more_incidents_is_not_promoted_however_well_it_forecasts() -> None:
    def alarm(start: int) -> AlarmEvent:
        return AlarmEvent("point", start, start + 5, 2.0, 1.0, start + 5)

    running = Run(residual_rmse=0.2, monitored=10_000, events=[alarm(100)])
    noisy = Run(residual_rmse=0.1, monitored=10_000, events=[alarm(100), alarm(5_000)])
    refused = verdict(running, noisy)
    assert not refused.promoted
    assert (refused.running_incidents, refused.candidate_incidents) == (1, 2)
    assert "2 incident(s) against 1" in refused.reason
    # One alarm joined to another within the quiet window is the same incident.
    joined = Run(residual_rmse=0.1, monitored=10_000, events=[alarm(100), alarm(110)])
    assert verdict(running, joined).promoted
    # A proving period where nothing was monitored proves nothing.
    unseen = Run(residual_rmse=None, monitored=0, events=[])
    assert not verdict(running, unseen).promoted
