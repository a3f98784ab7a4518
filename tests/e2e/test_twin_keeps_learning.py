"""The twin with no trained model, day by day in simulated time (bench/twin_relearn.py prints
the same cycle's figures): a stream of model `auto` with the reference sensor learns from one
hour of clean readings, runs a day, learns again on that history (the LSTM offered, as the
service's relearn job offers it), proves the candidate over a second day beside the running
model and promotes it; on a third clean day the model it runs raises at most 2 false-alarm
incidents and catches the lab record's spike, offset, excitation and stuck sensor. The
service's own code throughout (`learn`, threshold revisions, `relearned_from_history`, the
shadow's replay and `verdict`); tests/integration/api/test_relearning.py drives the same
steps through the service's jobs."""

from __future__ import annotations

import pytest

from bench.twin_relearn import keep_learning

pytestmark = pytest.mark.slow


def test_a_stream_learned_from_an_hour_relearns_on_its_day_and_catches_every_lab_fault() -> None:
    pytest.importorskip("torch")  # (the train extra: installed by `make venv`)
    cycle = keep_learning(seed=1, lstm=True)
    assert cycle.candidate is not None, cycle.refused
    assert cycle.verdict is not None and cycle.verdict.promoted, cycle.verdict
    assert cycle.candidate.kinds == ["lstm-stateful"]
    running = cycle.proving["running"].residual_rmse
    assert cycle.proving["candidate"].residual_rmse < 0.98 * running
    now = next(day for day in cycle.day3.values() if day.runs_now)
    assert now is cycle.day3["candidate"]
    assert now.false_incidents <= 2
    assert set(now.lab_faults) == {"spike", "offset", "excitation", "stuck"}
    assert all(first is not None for first in now.lab_faults.values()), now.lab_faults
    assert now.lab_false_incidents == 0
    # The model learned from the hour alone misses the excitation: what the relearning buys.
    assert cycle.day3["running"].lab_faults["excitation"] is None
