"""The twin's sustained sensor faults on a stream that learned its own model from the twin's
first 4,000 readings, with the twin's prediction (the redundant sensor) beside it: an offset, a
drift and a gain change are each one incident, open for as long as the fault lasts (a drift:
from when it has grown visible) and closed soon after the readings are back. No new operating
point is taken for normal by itself: that takes an operator
(tests/integration/api/test_new_normal.py).

Alone, the twin's displacement is learned as an autoregression of its changes (it wanders as
much as it oscillates): such a forecast follows a sustained offset within a reading, so only
the reference shows it while it lasts (README, "Streams that learn")."""

from __future__ import annotations

import numpy as np
import pytest

from app.learning.learn import learn
from app.monitoring.incidents import incident_spans
from app.simulation import Fault, FaultType, inject_faults
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising

LEARNING = 4000
START, END, COUNT = 5000, 6500, 8000
AFTER = 150  # readings after a fault's end by which its incident has closed


@pytest.mark.parametrize(
    "fault",
    [
        Fault(type=FaultType.OFFSET, start=START, end=END, magnitude=0.8),
        Fault(type=FaultType.DRIFT, start=START, end=END, magnitude=1.0),
        Fault(type=FaultType.GAIN, start=START, end=END, factor=1.5),
    ],
    ids=lambda fault: fault.type.value,
)
def test_a_sustained_fault_is_one_incident_for_as_long_as_it_lasts(fault: Fault) -> None:
    run = inject_faults(0, COUNT, [fault])
    times = (1_700_000_000_000_000 + np.arange(COUNT) * round(run.sample_period_s * 1e6)).astype(
        np.int64
    )
    learned = learn(times[:LEARNING], run.value[:LEARNING], references=run.reference[:LEARNING])
    readings = Readings.of_one(times, run.value[:, None], run.reference)
    events, _ = monitor_revising(learned, readings, learned_from=LEARNING)
    incidents = incident_spans(events)
    during = [(a, b) for a, b in incidents if a < END and (b is None or b > START)]
    assert len(during) == 1, incidents
    opened, closed = during[0]
    visible = START + (END - START) // 3 if fault.type is FaultType.DRIFT else START + 20
    assert START <= opened <= visible, incidents
    assert closed is not None and END <= closed <= END + AFTER, incidents
    assert [span for span in incidents if span not in during] == [], incidents
