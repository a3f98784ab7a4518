"""What the twin sends, and when: pure functions of the scenario and a clock reading.

A scenario is samples [start, start + samples) of one simulated run. The twin's own clock runs at
`rate_hz` readings per second of machine time; `speed` compresses it against the wall clock. With
`loop`, the run repeats after a pause of `LOOP_GAP_S` of machine time: longer than the service's
gap limit, so the stream warms up again instead of seeing the jump back to the first sample.

    reading g (0, 1, 2, ...) -> cycle g // samples, offset k = g % samples
    machine time  tau_g = cycle * (samples / rate + LOOP_GAP_S) + k / rate
    timestamp     t0 + tau_g                (what the service stores)
    due on wall   started + tau_g / speed   (when the client sends it)

Nothing here sleeps or reads a clock, so the pacing is tested with plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from numpy.typing import NDArray

from app.errors import DataError
from app.simulation.faults import Fault, inject_faults
from app.simulation.twin import simulate

FloatArray = NDArray[np.float64]

LOOP_GAP_S = 30.0
"""Machine time between two cycles of a looping twin (the service re-warms after 10 periods)."""


@dataclass(frozen=True)
class Scenario:
    """The readings of samples [start, start + len(values)) of one simulated run."""

    start: int
    values: FloatArray  # the primary sensor, faults injected (NaN = missing)
    references: FloatArray  # the redundant healthy sensor
    faults: tuple[Fault, ...]
    seed: int

    @property
    def samples(self) -> int:
        return int(self.values.shape[0])

    @property
    def stop(self) -> int:
        return self.start + self.samples

    def sent_faults(self) -> list[Fault]:
        """The faults that overlap the samples this scenario sends."""
        return [f for f in self.faults if f.end > self.start and f.start < self.stop]

    def fault_at(self, sample: int) -> Fault | None:
        return next((f for f in self.faults if f.start <= sample < f.end), None)


def build_scenario(
    seed: int,
    start: int,
    samples: int,
    faults: Sequence[Fault],
    *,
    run_length: int | None = None,
) -> Scenario:
    """Samples [start, start + samples) of a run of `run_length` (default: start + samples).

    The run's length is part of its definition (its noise is drawn for the whole run), so the
    lab's readings are those of an 8,000-sample run whatever slice of it is sent.
    """
    if start < 0:
        raise DataError(f"--start must be 0 or more, got {start}")
    if samples < 1:
        raise DataError(f"--samples must be at least 1, got {samples}")
    total = start + samples if run_length is None else run_length
    if start + samples > total:
        raise DataError(f"samples {start}..{start + samples - 1} run past the {total}-sample run")
    run = inject_faults(seed, total, list(faults)) if faults else simulate(seed, total)
    stop = start + samples
    return Scenario(
        start=start,
        values=run.value[start:stop].astype(np.float64),
        references=run.reference[start:stop].astype(np.float64),
        faults=tuple(faults),
        seed=seed,
    )


@dataclass(frozen=True)
class Timeline:
    """Maps the twin's reading number to machine time, timestamps and wall-clock due times."""

    samples: int  # readings per cycle
    rate_hz: float
    speed: float = 1.0
    loop: bool = False

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise DataError("a timeline needs at least one sample")
        if not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise DataError(
                f"--rate must be a positive number of readings per second, got {self.rate_hz}"
            )
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise DataError(f"--speed must be positive, got {self.speed}")

    @property
    def total(self) -> int | None:
        """Readings in the whole run; None when looping forever."""
        return None if self.loop else self.samples

    @property
    def cycle_s(self) -> float:
        return self.samples / self.rate_hz + LOOP_GAP_S

    def offset(self, g: int) -> int:
        """Which sample of the scenario reading g is."""
        return g % self.samples

    def machine_time(self, g: int) -> float:
        cycle, k = divmod(g, self.samples)
        return cycle * self.cycle_s + k / self.rate_hz

    def due(self, g: int, started: float) -> float:
        """Wall-clock time (same clock as `started`) at which reading g is due."""
        return started + self.machine_time(g) / self.speed

    def due_count(self, now: float, started: float) -> int:
        """How many readings are due by `now`: every g with due(g) <= now."""
        # A microsecond of slack: waiting until due(g) must make g due despite rounding.
        elapsed = (now - started) * self.speed + 1e-6
        if elapsed < 0:
            return 0
        cycle = math.floor(elapsed / self.cycle_s)
        within = elapsed - cycle * self.cycle_s
        count = cycle * self.samples + min(self.samples, math.floor(within * self.rate_hz) + 1)
        if self.loop:
            return count
        return min(count, self.samples)

    def next_batch(self, sent: int, now: float, started: float, max_batch: int) -> range:
        """Readings to send now: the due ones not sent yet, at most `max_batch`, within a cycle.

        A batch never spans two cycles, so the pause between cycles stays a pause.
        """
        due = self.due_count(now, started)
        if due <= sent:
            return range(sent, sent)
        cycle_end = (sent // self.samples + 1) * self.samples
        return range(sent, min(due, sent + max_batch, cycle_end))

    def timestamp(self, g: int, t0: datetime) -> datetime:
        return t0 + timedelta(seconds=self.machine_time(g))

    def reading_number(self, t: datetime, t0: datetime) -> int:
        """Inverse of `timestamp` (to the nearest reading)."""
        tau = (t - t0).total_seconds()
        cycle = math.floor((tau + 0.5 / self.rate_hz) / self.cycle_s)
        k = round((tau - cycle * self.cycle_s) * self.rate_hz)
        return cycle * self.samples + k


def resume_origin(now: datetime, last_t: datetime | None, rate_hz: float) -> datetime:
    """Where the twin's clock starts: now, unless the stream already holds readings at or after
    now (an accelerated run ran ahead of the wall clock); then far enough after them that the
    service sees a gap and warms up again rather than a jump."""
    origin = now.replace(microsecond=(now.microsecond // 1000) * 1000)
    if last_t is None:
        return origin
    return max(origin, last_t + timedelta(seconds=LOOP_GAP_S + 1.0 / rate_hz))
