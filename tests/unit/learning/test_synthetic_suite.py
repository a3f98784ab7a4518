"""Streams that learn, on series of every shape a user may send: each onboards, stays within its
false-alarm budget on its own clean continuation, catches a spike, a level shift, a flatline
and a variance change, and keeps a sustained fault one incident for as long as it lasts.

Everything runs the service's own code: `learn` for the fit and `replay` (the recurrence, with
the learning readings silent) for the readings, as `handover.adopt` runs them.

Statistical slack: the budget is 1 false alarm a day; a clean continuation of ten learning
periods is hours to weeks long, and a case may raise at most what a Poisson count with the
budget's mean over those days stays within 99% of the time (`budget_check`, the evaluator's
own rule), and at least 2: a continuation of hours would otherwise allow none, while its
thresholds rest on a learning period of a few hundred readings, whose estimates' own error is
part of the slack (2 is what a Poisson count with a mean of 0.44 stays within 99% of the
time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from app.benchmark.scoring import budget_check
from app.learning.learn import LearnedModel, learn
from app.monitoring.incidents import incident_spans
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising

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


def bursty_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Social-media counts every five minutes: a daily rhythm and bursts whose size is heavy
    tailed (a few times the rate, now and then ten times), normal for such a series."""
    t = np.arange(n) * 300.0
    rate = 6.0 * (1.3 + np.sin(2 * np.pi * t / DAY))
    start = int(rng.integers(0, 50))
    while start < n:
        rate[start : start + int(rng.integers(1, 12))] *= float(np.exp(rng.exponential(1.0)))
        start += int(rng.integers(20, 200))
    return rng.poisson(rate).astype(float)


def low_noise_daily(rng: np.random.Generator, n: int) -> np.ndarray:
    """A clean daily pattern every five minutes, its noise a two-hundredth of its swing."""
    t = np.arange(n) * 300.0
    return 50 + 10 * np.sin(2 * np.pi * t / DAY) + rng.normal(0, 0.05, n)


def jump_at_the_end(rng: np.random.Generator, n: int) -> np.ndarray:
    """A level that moved 20 readings before the end of the 1,000 learning readings and
    stayed there: the new level is what normal is now."""
    values = 20 + ar(rng, n, 0.5)
    values[980:] += 6.0
    return values


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
    bursts: bool = False  # its normal bursts reach ten times its spread: faults are sized on them


CASES = [
    Case("constant", lambda rng, n: np.full(n, 3.0), flatline=False),
    Case(
        "square wave",
        lambda rng, n: np.where(np.arange(n) // 25 % 2, 1.0, -1.0) + rng.normal(0, 0.05, n),
    ),
    Case("daily and weekly seasons, 5 min", lambda r, n: seasonal(r, n, 300.0), 300.0, 2 * 2016),
    Case("Poisson counts with bursts", poisson_with_bursts, 60.0),
    Case("integer counts with heavy bursts, 5 min", bursty_counts, 300.0, 2016, bursts=True),
    Case("low-noise daily pattern, 5 min", low_noise_daily, 300.0, 2016),
    Case("a jump at the end of learning", jump_at_the_end),
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
    """The incidents after the learning readings, as the service raises them (its thresholds
    revised along the way)."""
    events, _ = monitor_revising(
        learned, Readings.of_one(times, values[:, None]), learned_from=learning
    )
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
        allowed = max(2, budget_check(len(incidents), days, 1.0).allowed)
        assert len(incidents) <= allowed, (seed, incidents, f"{days:.2f} days")


def inject(
    values: np.ndarray, kind: str, at: int, rng: np.random.Generator, bursts: bool = False
) -> np.ndarray:
    """`kind` at reading `at`, its size in spreads of the readings before (for a series whose
    normal bursts reach ten spreads, in its largest excursion yet: a spike of twice it, a
    shift of it)."""
    faulty = values.copy()
    spread = max(float(np.std(values[:at])), 1e-12 * abs(float(np.mean(values[:at]))), 1e-300)
    if bursts:
        spread = float(np.max(np.abs(values[:at] - np.median(values[:at])))) / 4
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
    incidents = monitor(learned, times, inject(values, fault, at, rng, case.bursts), case.learning)
    window = 60  # readings in which the fault must be alarmed
    assert any(start < at + window and (stop is None or stop > at) for start, stop in incidents), (
        fault,
        incidents,
    )


REGIME_CASES = [
    case for case in CASES if case.name in ("200-reading learning period", "square wave")
]
"""Series with a normal to return to (an autoregression, a square wave): a sustained shift is a
fault for as long as it lasts."""


@pytest.mark.parametrize(
    "returns", [True, False], ids=["a shift that returns", "a sustained shift"]
)
@pytest.mark.parametrize(
    "case",
    [
        *REGIME_CASES,
        Case(
            "noisy sine",
            lambda rng, n: 3 * np.sin(np.arange(n) / 50 * 2 * np.pi) + rng.normal(0, 0.3, n),
        ),
    ],
    ids=lambda case: case.name,
)
def test_a_sustained_shift_is_one_incident_while_it_lasts(case: Case, returns: bool) -> None:
    """Shifted by 5 of its learning readings' spreads for four learning periods: one incident
    from the shift's start, open throughout, closed within a rolling window (50 readings) and
    the quiet rule of its return (or still open if it never returns)."""
    rng = np.random.default_rng(11)
    learning = case.learning
    n = 8 * learning
    values = case.make(rng, n)
    times = times_of(case, rng, n)
    learned = learn(times[:learning], values[:learning, None])
    start, stop = 2 * learning, 6 * learning if returns else n
    spread = float(np.std(np.diff(values[:learning]))) / np.sqrt(2)
    faulty = values.copy()
    faulty[start:stop] += 5 * spread
    incidents = monitor(learned, times, faulty, learning)
    during = [(a, b) for a, b in incidents if a < stop and (b is None or b > start)]
    assert len(during) == 1, (learned.kinds, incidents)
    opened, closed = during[0]
    assert start <= opened < start + 20, (opened, closed)
    if returns:
        assert closed is not None and stop <= closed <= stop + 60, (opened, closed)
    else:
        assert closed is None, (opened, closed)
