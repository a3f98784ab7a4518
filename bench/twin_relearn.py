"""A stream that keeps learning, on the built-in twin with no trained model, day by day: a stream
of model "auto" (with the reference sensor) learns from one hour of clean readings (the
service's default: linear models only), runs a simulated day of normal operation, learns again
on its history (the stateful LSTM offered when torch is installed: a relearning runs off the
service's readings, where a network's training can be afforded), proves the candidate on the
next day beside the running model, and the winner meets a third clean day and the lab record's
four faults. The service's own code: `learn`, `monitor_revising`, `app/learning/relearn.py`
(`relearned_from_history`, `verdict`) and `app/streams/shadow.py` (`run`).

    .venv/bin/python bench/twin_relearn.py [--seed 1] [--no-lstm]

Prints, for each day, each model's forecast error (RMSE of its residuals) and false-alarm
incidents, the proof's verdict, and the faults each model catches. Takes about a minute.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from app.learning.learn import LearnedModel, learn
from app.learning.network import torch_available
from app.learning.relearn import DriftError, Verdict, relearned_from_history, verdict
from app.monitoring.config import MonitorConfig, RollingRMSConfig
from app.monitoring.incidents import alarm_spans, incident_spans
from app.simulation.faults import LAB_FAULTS, inject_faults
from app.simulation.twin import TwinRun, simulate
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising
from app.streams.recomputed import REWARM_READINGS
from app.streams.recurrence import Recurrence
from app.streams.shadow import Run, run

HOUR = 36_000  # readings at 10 Hz
DAY = 24 * HOUR


def micros(count: int) -> np.ndarray:
    return (np.arange(count) * 100_000 + 1_700_000_000_000_000).astype(np.int64)


def readings_of(twin: TwinRun) -> Readings:
    return Readings.of_one(micros(twin.value.shape[0]), twin.value[:, None], twin.reference)


def scored(recurrence: Recurrence, twin: TwinRun, period: float, warm: int) -> Run:
    """The recurrence over a run of the twin, its first `warm` readings warming it silently."""
    return run(recurrence, readings_of(twin), period, start=0, skip=warm)


def faults_caught(recurrence: Recurrence, period: float) -> tuple[dict[str, int | None], int]:
    """What the recurrence raises on the lab record (seed 0, its four faults from reading
    7,100 on), warmed silently on its first `REWARM_READINGS` readings as a switch warms a
    model: each fault's first alarm (readings after its start; None: missed), and the
    incidents on normal readings."""
    lab = inject_faults(0, 8500, LAB_FAULTS)
    events = scored(recurrence, lab, period, REWARM_READINGS).events
    found: dict[str, int | None] = {}
    for fault in LAB_FAULTS:
        during = [e for e in events if fault.start <= e.start < fault.end + 20]
        found[fault.type.value] = min((e.start - fault.start for e in during), default=None)
    spans = incident_spans(events)
    normal = [s for s in spans if not any(f.start <= s[0] < f.end + 90 for f in LAB_FAULTS)]
    return found, len(normal)


def excitation_margin(model: LearnedModel, monitor: MonitorConfig) -> str:
    """The rolling RMS threshold in residual units beside the largest windowed residual RMS
    on the lab record's normal readings (after the warm-up, before the faults) and in its
    excitation: whether any threshold on this statistic could tell them apart."""
    rms = next(d for d in monitor.detectors if isinstance(d, RollingRMSConfig))
    assert rms.gains is not None
    lab = inject_faults(0, 8500, LAB_FAULTS)
    residuals = model.forecast(readings_of(lab)).residuals[:, 0]
    window = np.sqrt(np.convolve(residuals**2, np.ones(rms.window) / rms.window, "valid"))
    spike = LAB_FAULTS[0].start
    excitation = next(f for f in LAB_FAULTS if f.type.value == "excitation")
    return (
        f"rolling RMS threshold {rms.threshold / rms.gains[0]:.3f}, largest {rms.window}-reading "
        f"RMS on normal readings {window[REWARM_READINGS : spike - rms.window].max():.3f}, "
        f"in the excitation {window[excitation.start : excitation.end].max():.3f}"
    )


def describe(name: str, model: LearnedModel) -> None:
    print(f"  {name}: {', '.join(model.kinds)} (LSTM: {model.network_note})")


@dataclass
class Day3:
    """A model on the third clean day and on the lab record."""

    runs_now: bool
    false_incidents: int
    lab_faults: dict[str, int | None]
    lab_false_incidents: int
    margin: str


@dataclass
class Cycle:
    running: LearnedModel
    day1_incidents: int
    revisions: int
    candidate: LearnedModel | None = None
    refused: str | None = None
    proving: dict[str, Run] = field(default_factory=dict)
    verdict: Verdict | None = None
    day3: dict[str, Day3] = field(default_factory=dict)


def keep_learning(seed: int, lstm: bool) -> Cycle:
    """The hour, the day, the relearning, the proof and the third day (see the module)."""
    history = simulate(seed, HOUR + DAY)
    readings = readings_of(history)
    first = learn(readings.times[:HOUR], history.value[:HOUR], references=history.reference[:HOUR])
    period = first.sample_period_s
    events, revisions = monitor_revising(first, readings, learned_from=HOUR)
    running_monitor = revisions[-1][1] if revisions else first.monitor
    running = Recurrence(first.forecaster, running_monitor)
    cycle = Cycle(first, len(incident_spans(events)), len(revisions))
    covered = [(start, stop) for _, start, stop in alarm_spans(events)]
    try:
        candidate = relearned_from_history(
            first,
            readings,
            covered=covered,
            false_alarms_per_day=first.false_alarms_per_day,
            lstm=lstm,
        )
    except DriftError as exc:
        cycle.refused = exc.detail
        return cycle
    cycle.candidate = candidate
    relearned = candidate.recurrence()

    proving = simulate(seed + 1, HOUR + DAY)  # its first hour warms both models
    cycle.proving = {
        "running": scored(running, proving, period, HOUR),
        "candidate": scored(relearned, proving, period, HOUR),
    }
    cycle.verdict = verdict(cycle.proving["running"], cycle.proving["candidate"])
    chosen = relearned if cycle.verdict.promoted else running

    clean = simulate(seed + 2, HOUR + DAY)
    models = (
        ("running", running, first, running_monitor),
        ("candidate", relearned, candidate, candidate.monitor),
    )
    for name, recurrence, model, monitor in models:
        found, false_on_lab = faults_caught(recurrence, period)
        cycle.day3[name] = Day3(
            runs_now=recurrence is chosen,
            false_incidents=len(incident_spans(scored(recurrence, clean, period, HOUR).events)),
            lab_faults=found,
            lab_false_incidents=false_on_lab,
            margin=excitation_margin(model, monitor),
        )
    return cycle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="the first clean day's seed")
    parser.add_argument("--no-lstm", action="store_true", help="relearn without the LSTM")
    args = parser.parse_args()
    started = time.perf_counter()
    cycle = keep_learning(args.seed, torch_available() and not args.no_lstm)
    print("hour 1: learned from one hour of clean readings")
    describe("running", cycle.running)
    print(
        f"day 1: {cycle.day1_incidents} false-alarm incident(s), "
        f"thresholds revised {cycle.revisions} time(s)"
    )
    if cycle.candidate is None:
        print(f"relearning refused: {cycle.refused}")
        return
    print(f"relearned on {HOUR + DAY:,} readings of history")
    describe("candidate", cycle.candidate)
    for name, side in cycle.proving.items():
        print(
            f"day 2 (proving), {name}: forecast RMSE {side.residual_rmse:.4f}, "
            f"{len(incident_spans(side.events))} incident(s)"
        )
    assert cycle.verdict is not None
    decided = cycle.verdict
    print(f"verdict: {'promoted' if decided.promoted else 'discarded'}: {decided.reason}")
    for name, day in cycle.day3.items():
        found = ", ".join(
            f"{fault} {'-' if first is None else f'+{first}'}"
            for fault, first in day.lab_faults.items()
        )
        print(
            f"day 3, {name}{' (runs now)' if day.runs_now else ''}: "
            f"{day.false_incidents} false-alarm incident(s); lab record: {found} "
            f"({day.lab_false_incidents} incident(s) on normal readings); {day.margin}"
        )
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
