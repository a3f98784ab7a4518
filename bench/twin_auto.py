"""The built-in twin with no trained model: a stream of model "auto" (with the reference
sensor) learns from one hour of clean readings, then meets the lab record's four faults and a
clean simulated day. The service's own code: `learn`, then `monitor_revising` (the replay
`handover.adopt` runs, thresholds revised as `Learner.revise` does).

    .venv/bin/python bench/twin_auto.py [--seed-lab 0] [--seed-day 1] [--lstm]

`--lstm` offers the stateful LSTM among the candidates (TWINWATCH_LEARNING_LSTM=true).

Prints what each fault raised (alarms, incidents) and the clean day's false-alarm incidents.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from app.learning.learn import LearnedModel, learn
from app.monitoring.incidents import incident_spans
from app.simulation.faults import LAB_FAULTS, inject_faults
from app.simulation.twin import simulate
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising

HOUR = 36_000  # readings at 10 Hz


def micros(count: int) -> np.ndarray:
    return (np.arange(count) * 100_000 + 1_700_000_000_000_000).astype(np.int64)


def run(values: np.ndarray, references: np.ndarray, lstm: bool) -> tuple[LearnedModel, list, int]:
    """Learn from the first hour, then every reading as the service would (thresholds revised
    every ten hours): the learned model, the events, how many revisions."""
    times = micros(values.shape[0])
    learned = learn(times[:HOUR], values[:HOUR], references=references[:HOUR], lstm=lstm)
    events, revisions = monitor_revising(
        learned, Readings.of_one(times, values, references), learned_from=HOUR
    )
    return learned, events, len(revisions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-lab", type=int, default=0)
    parser.add_argument("--seed-day", type=int, default=1)
    parser.add_argument("--lstm", action="store_true", help="offer the LSTM candidate")
    args = parser.parse_args()
    started = time.perf_counter()
    faults = [
        f.model_copy(update={"start": f.start + HOUR, "end": f.end + HOUR}) for f in LAB_FAULTS
    ]
    lab = inject_faults(args.seed_lab, HOUR + 8500, faults)
    learned, events, _ = run(lab.value, lab.reference, args.lstm)
    print("learned:", learned.kinds, "seasons", learned.seasons, "| LSTM:", learned.network_note)
    print("detectors:", [d.kind for d in learned.monitor.detectors])
    incidents = incident_spans(events)
    for fault in faults:
        caught = sorted({e.detector for e in events if fault.start <= e.start < fault.end + 20})
        first = [e.start - fault.start for e in events if fault.start <= e.start < fault.end + 20]
        touching = [i for i in incidents if i[0] < fault.end + 20 and (i[1] or 1e18) > fault.start]
        print(
            f"{fault.type.value:11s} caught by {', '.join(caught) or '-':30s} first alarm "
            f"+{min(first) if first else '-'} samples, {len(touching)} incident(s)"
        )
    normal = [i for i in incidents if not any(f.start <= i[0] < f.end + 90 for f in faults)]
    print(f"lab record: {len(incidents)} incidents, {len(normal)} on normal readings")
    day = simulate(args.seed_day, HOUR + 864_000)
    _, events, revised = run(day.value, day.reference, args.lstm)
    print(
        f"clean day (seed {args.seed_day}): {len(incident_spans(events))} false-alarm "
        f"incidents, alarms by detector {dict(Counter(e.detector for e in events))}, "
        f"thresholds revised {revised} time(s)"
    )
    print(f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
