"""The reference detectors alarm on an injected spike and stay quiet on a clean stretch, through
the service's own alarm rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2, norm

from app.benchmark.datasets import LabelledFile
from app.benchmark.reference import (
    REFERENCES,
    Reference,
    alarm_events,
    ar_residual,
    hotelling,
    tail_probability,
    windowed_gaussian,
)
from app.benchmark.runner import run_reference
from app.learning.thresholds import LEAST_SURPRISE
from tests.unit.benchmark.labelled import readings

LEARN = 200
SPIKE = 450


def spiked_file(channels: int = 2) -> LabelledFile:
    rows = 600
    times = np.arange(rows, dtype=np.int64) * 60_000_000  # one a minute: 1,440 a day
    values = readings(rows, channels=channels, spike_at=SPIKE)
    quiet = np.zeros(rows, dtype=bool)
    return LabelledFile("spiked", times, values, [f"c{i}" for i in range(channels)], quiet, None)


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda r: r.name)
def test_a_spike_is_alarmed_and_a_clean_stretch_is_not(reference: Reference) -> None:
    run = run_reference(reference, spiked_file(), LEARN, false_alarms_per_day=1.0)
    assert run.alarmed[SPIKE]
    assert not run.alarmed[:SPIKE].any()  # learning rows and the clean stretch after them
    assert not run.alarmed[SPIKE + 30 :].any()  # closed again after five quiet readings
    assert run.incidents == [(SPIKE, run.events[-1]["closed"])]


def test_thresholds_follow_the_budget_split_over_the_channels() -> None:
    labelled = spiked_file(channels=3)
    assert tail_probability(labelled.times, LEARN, 0.1) == pytest.approx(0.1 / 1440)
    # The service's least surprise caps what a generous budget would allow on slow data.
    tail = tail_probability(labelled.times, LEARN, 2.0)
    assert tail == LEAST_SURPRISE < 2.0 / 1440
    for statistic in (windowed_gaussian, ar_residual):
        found = statistic(labelled.values, LEARN, tail)
        assert found.channels == 3
        assert found.threshold == pytest.approx(norm.isf(tail / 3 / 2))
    t2 = hotelling(labelled.values, LEARN, tail)
    assert t2.threshold == pytest.approx(chi2.isf(tail, 3))


def test_constant_and_missing_readings_give_no_statistic() -> None:
    values = readings(400, channels=3)
    values[:, 2] = 7.0  # constant while learning: dropped
    values[300, :2] = np.nan  # a missing row: skipped
    for statistic in (windowed_gaussian, ar_residual, hotelling):
        found = statistic(values, LEARN, 1 / 1440)
        assert found.channels == 2
        assert np.isnan(found.values[:LEARN]).all()
        assert np.isnan(found.values[300])
        assert np.isfinite(found.values[LEARN:300]).all()


def test_a_windowed_gaussian_on_a_flat_window_has_no_z() -> None:
    values = readings(500, channels=1)
    values[LEARN:, 0] = 0.25  # flat from the learning's end: no spread once the window is in it
    found = windowed_gaussian(values, LEARN, 1 / 1440)
    assert np.isfinite(found.values[LEARN : 2 * LEARN]).all()
    assert np.isnan(found.values[2 * LEARN :]).all()


def test_exceedances_become_alarms_by_the_services_rule() -> None:
    statistic = np.full(40, 1.0)
    statistic[:5] = np.nan  # learning: no statistic
    statistic[[10, 12]] = 9.0
    (event,) = alarm_events(statistic, 3.0, "ref")
    assert (event.start, event.cleared_at) == (10, 17)  # five readings back inside: 13 .. 17
    statistic[[13, 14]] = np.nan  # no evidence either way: skipped
    (event,) = alarm_events(statistic, 3.0, "ref")
    assert event.cleared_at == 19
    statistic[36] = 9.0  # still open when the file ends
    events = alarm_events(statistic, 3.0, "ref")
    assert (events[-1].start, events[-1].cleared_at) == (36, None)
