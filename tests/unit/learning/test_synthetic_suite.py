"""Streams that learn, on series of every shape a user may send: each onboards, stays within its
false-alarm budget on its own clean continuation, and catches a spike, a level shift, a flatline
and a variance change.

Everything runs the service's own code: `learn` for the fit and `replay` (the recurrence, with
the learning readings silent) for the readings, as `LiveStreams.adopt` runs them.

Statistical slack: the budget is 1 false alarm a day; a clean continuation of ten learning
periods is hours to weeks long, so a case may raise at most max(2, 3 x budget x days) false
incidents: 2 is what a Poisson count with a mean under 0.5 stays within 99% of the time, and the
thresholds come from a short learning period (their estimates' own error is part of it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from app.learning.learn import LearnedModel, learn
from app.monitoring.incidents import incident_spans
from app.streams.learning import replay
from app.streams.recurrence import Readings

DAY = 86_400.0


def ar(rng: np.random.Generator, n: int, phi: float, sigma: float = 1.0) -> np.ndarray:
    noise = rng.normal(0, sigma, n)
    out = np.empty(n)
    out[0] = noise[0]
    for i in range(1, n):
        out[i] = phi * out[i - 1] + noise[i]
    return out


def poisson_with_bursts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Counts a minute with a busy spell (2.5 x, 3 to 15 minutes) every 2 to 6 hours: normal
    for this series, and its learning day sees a handful of them."""
    rate = np.full(n, 4.0)
    start = int(rng.integers(0, 120))
    while start < n:
        rate[start : start + int(rng.integers(3, 16))] *= 2.5
        start += int(rng.integers(120, 360))
    return rng.poisson(rate).astype(float)


def seasonal(rng: np.random.Generator, n: int, period_s: float) -> np.ndarray:
    t = np.arange(n) * period_s
    daily = 3.0 * np.sin(2 * np.pi * t / DAY)
    weekly = 1.5 * np.sin(2 * np.pi * t / (7 * DAY))
    return 10 + daily + weekly + rng.normal(0, 0.3, n)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[np.random.Generator, int], np.ndarray]
    period_s: float = 1.0
    learning: int = 1000
    jitter: float = 0.0  # of the period, uniformly either way
    flatline: bool = True  # a flatline is a fault (not for a constant)


CASES = [
    Case("constant", lambda rng, n: np.full(n, 3.0), flatline=False),
    Case(
        "square wave",
        lambda rng, n: np.where(np.arange(n) // 25 % 2, 1.0, -1.0) + rng.normal(0, 0.05, n),
    ),
    Case("daily and weekly seasons, 5 min", lambda r, n: seasonal(r, n, 300.0), 300.0, 2 * 2016),
    Case("Poisson counts with bursts", poisson_with_bursts, 60.0),
    Case("random walk", lambda rng, n: np.cumsum(rng.normal(0, 1, n))),
    Case("200-reading learning period", lambda rng, n: ar(rng, n, 0.5), learning=200),
    Case("jittered timestamps", lambda rng, n: ar(rng, n, 0.5), jitter=0.2),
    Case("near 1e9", lambda rng, n: 1e9 + rng.normal(0, 5, n)),
    Case("near 1e-9", lambda rng, n: 1e-9 * (1 + 0.1 * rng.normal(0, 1, n))),
    Case("integers", lambda rng, n: np.round(20 + 2 * rng.normal(0, 1, n))),
    Case("negative", lambda rng, n: -50 + ar(rng, n, 0.3, 2.0)),
]


def times_of(case: Case, rng: np.random.Generator, n: int) -> np.ndarray:
    seconds = np.arange(n) * case.period_s
    if case.jitter:
        seconds = seconds + rng.uniform(-case.jitter, case.jitter, n) * case.period_s
    return np.round((1.7e9 + seconds) * 1e6).astype(np.int64)


def monitor(
    learned: LearnedModel, times: np.ndarray, values: np.ndarray, learning: int
) -> list[tuple[int, int | None]]:
    recurrence = learned.recurrence()
    state = recurrence.new_state()
    replayed = replay(
        recurrence,
        state,
        Readings.of_one(times, values[:, None]),
        learned.sample_period_s,
        quiet_until=learning,
        events_from=learning,
    )
    events = replayed.closed + recurrence.monitor.open_events(state.monitor)
    return incident_spans(events)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_onboards_and_stays_within_its_budget(case: Case) -> None:
    for seed in range(3):
        rng = np.random.default_rng(seed)
        n = 11 * case.learning
        values = case.make(rng, n)
        times = times_of(case, rng, n)
        learned = learn(times[: case.learning], values[: case.learning, None])
        assert learned.sample_period_s == pytest.approx(case.period_s, rel=0.05)
        incidents = monitor(learned, times, values, case.learning)
        days = (n - case.learning) * case.period_s / DAY
        allowed = max(2.0, 3 * days)
        assert len(incidents) <= allowed, (seed, incidents, f"{days:.2f} days")


def inject(values: np.ndarray, kind: str, at: int, rng: np.random.Generator) -> np.ndarray:
    faulty = values.copy()
    spread = max(float(np.std(values[:at])), 1e-12 * abs(float(np.mean(values[:at]))), 1e-300)
    if kind == "spike":
        faulty[at] += 8 * spread + 1e-6 * abs(faulty[at])
    elif kind == "level shift":
        faulty[at:] += 4 * spread + 1e-6 * abs(faulty[at])
    elif kind == "flatline":
        faulty[at:] = faulty[at - 1]
    elif kind == "variance change":
        faulty[at:] += rng.normal(0, 4 * spread + 1e-6 * abs(faulty[at]), faulty.shape[0] - at)
    return faulty


@pytest.mark.parametrize("fault", ["spike", "level shift", "flatline", "variance change"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_catches_each_fault(case: Case, fault: str) -> None:
    if fault == "flatline" and not case.flatline:
        pytest.skip("a constant series is flat already: a flatline is its normal")
    rng = np.random.default_rng(7)
    n = 3 * case.learning
    values = case.make(rng, n)
    times = times_of(case, rng, n)
    learned = learn(times[: case.learning], values[: case.learning, None])
    at = 2 * case.learning
    incidents = monitor(learned, times, inject(values, fault, at, rng), case.learning)
    window = 60  # readings in which the fault must be alarmed
    assert any(start < at + window and (stop is None or stop > at) for start, stop in incidents), (
        fault,
        incidents,
    )
