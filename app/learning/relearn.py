"""Streams that keep learning: a learned stream learns again from its own stored history as it
grows, and the candidate takes over only once it has proved better on the readings that follow.

A stream learns from its first readings (an hour, a thousand readings): everything it knows
about the machine comes from that stretch, and a normal day often swings further than its
first hour did. Its thresholds are revised as it runs (`app/learning/adapt.py`), but its model
is not. Relearning fits the whole model again, by the same rules as its first learning (the
same families, and the stateful LSTM once the history is long enough), on the readings it has
stored since it started:

- **When** (`RelearnPlan`): at 1 day and at 1 week of history, then every week after, by
  default. An early relearning is where a short learning period gains most; later ones follow
  a machine that changes with the seasons.
- **On what** (`normal_readings`): every stored reading outside the stream's alarms and the
  quiet spell after each (`QUIET_TO_JOIN` readings): a fault is never evidence of normal.
- **Not on a slow fault** (`drift`): a fault that develops slowly enough to stay under the
  thresholds (a sensor drifting, a gain creeping up) leaves no alarm to exclude, and a model
  learned on it would accept it. The history is cut into `DRIFT_BLOCKS` consecutive blocks;
  a monotone trend across them (Mann-Kendall's test, the tau of block against time, at
  `DRIFT_SIGNIFICANCE`) that is also large (Sen's slope across the blocks) in the mean of the
  gap to the reference sensor, in the gap's spread, or in the spread of the running model's
  residuals, stops the relearning: the stream keeps its model and says why. A normal stretch
  wanders but does not keep going one way for a day; a fault under way does. Without a
  reference sensor, only the residuals' spread can show it: a slow drift that the forecast
  follows stays invisible there, as it does to the running model.
- **Proof before promotion** (`verdict`): the candidate shadows the stream for a proving
  period (a day by default) and takes over only if, on those readings, its forecast error is
  clearly lower (by 2 %) and it raised no more incidents than the running model; otherwise it
  is discarded, with its figures kept. A deliberately worse model is never promoted.

Pure: numpy and scipy, no I/O. The service's learner schedules and decides
(`app/streams/learning.py`), the job process fits (`app/jobs/process.py`, kind `relearn`);
`bench/twin_relearn.py` runs the whole cycle on the built-in twin, day by day.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from app.errors import DataError
from app.learning.learn import DAY_S, WEEK_S, LearnedModel, learn
from app.monitoring.incidents import QUIET_TO_JOIN, incident_spans
from app.streams.blocks import Readings
from app.streams.shadow import Run

DRIFT_BLOCKS = 24
"""Blocks the history is cut into for the drift guard: hours of a day's history."""
DRIFT_SIGNIFICANCE = 1e-3
"""The trend test's p-value under which a trend is one: a normal stretch fails it about once
in a thousand quantities tested."""
DRIFT_SHARE = 0.25
"""A trend counts when the reference gap's mean moves by a quarter of the running model's
level threshold across the history, or a spread by a quarter of its typical value."""
MIN_BLOCK = 10
"""Normal readings a block needs for the guard to judge."""
RELEARN_MOST_READINGS = 2_000_000
"""The latest readings a relearning learns from, at most: 2.3 days at 10 Hz, 23 days at 1 Hz,
19 years at 5 min. More would only lengthen a weekly job (and its memory) for the few models
whose seasons need longer."""
CLEARLY_LOWER = 0.98
"""A candidate's forecast error must be at most 0.98 x the running model's: closer is a tie
(a day's readings vary that much between two equal models), and a switch costs a version."""


class DriftError(DataError):
    """The history may hide a slow fault: the stream keeps its model."""


@dataclass(frozen=True)
class RelearnPlan:
    """When a learned stream learns again (`after_s`: at these spans of history, in seconds,
    then every `every_s`, None: no more), and how long a candidate proves itself before it may
    take over."""

    after_s: tuple[float, ...] = (DAY_S, WEEK_S)
    every_s: float | None = WEEK_S
    proving_s: float = DAY_S

    @classmethod
    def of(cls, learning: Mapping[str, Any] | None) -> RelearnPlan | None:
        """A stream's plan from its learning configuration (`{"relearn": {...}}`; absent: the
        defaults; false: None, it never relearns)."""
        raw = None if learning is None else learning.get("relearn")
        if raw is False:
            return None
        if not raw:
            return cls()
        default = cls()
        every = raw.get("every_s", default.every_s)
        return cls(
            after_s=tuple(float(x) for x in raw.get("after_s", default.after_s)),
            every_s=None if every is None else float(every),
            proving_s=float(raw.get("proving_s", default.proving_s)),
        )

    def next_at(self, last_s: float | None) -> float | None:
        """The span of history at which the relearning after one at `last_s` (None: none yet)
        is due; None: no more."""
        for point in sorted(self.after_s):
            if last_s is None or point > last_s:
                return point
        if self.every_s is None:
            return None
        return (last_s or 0.0) + self.every_s


def normal_readings(count: int, covered: Sequence[tuple[int, int | None]]) -> np.ndarray:
    """Which of `count` readings lie outside every alarm span [start, stop) (None: still
    open) and the quiet spell after it: those that may teach a model."""
    normal = np.ones(count, dtype=bool)
    for start, stop in covered:  # (sample numbers from the first reading given: some < 0)
        end = count if stop is None else min(count, stop + QUIET_TO_JOIN)
        if end > 0:
            normal[max(0, start) : end] = False
    return normal


def drift(
    residuals: np.ndarray,
    gaps: np.ndarray | None,
    normal: np.ndarray,
    *,
    level_threshold: float | None,
) -> str | None:
    """Why the normal readings may hide a slow fault (see the module), or None: the running
    model's residuals (R, C), the gaps to the reference sensor (R,) if the stream has one."""
    kept = np.flatnonzero(normal)
    if kept.size < DRIFT_BLOCKS * MIN_BLOCK:
        return None
    blocks = np.array_split(kept, DRIFT_BLOCKS)
    watched: list[tuple[str, np.ndarray, float | None]] = []
    if gaps is not None:
        means = _per_block(gaps, blocks, np.nanmean)
        spreads = _per_block(gaps, blocks, np.nanstd)
        level = level_threshold if level_threshold is not None else float(np.nanmedian(spreads))
        watched += [("the gap to the reference sensor", means, level)]
        watched += [("the spread of the gap to the reference sensor", spreads, None)]
    for c in range(residuals.shape[1]):
        rms = np.sqrt(_per_block(residuals[:, c] ** 2, blocks, np.nanmean))
        watched += [(f"the spread of channel {c}'s forecast errors", rms, None)]
    for what, series, unit in watched:
        found = _trend(series, unit)
        if found is not None:
            return f"{what} {found} across the history: a slow fault may be under way"
    return None


def _per_block(
    values: np.ndarray, blocks: list[np.ndarray], statistic: Callable[..., Any]
) -> np.ndarray:
    out = np.full(len(blocks), np.nan)
    for i, block in enumerate(blocks):
        part = values[block]
        if int(np.isfinite(part).sum()) >= MIN_BLOCK:
            out[i] = statistic(part)
    return out


def _trend(series: np.ndarray, unit: float | None) -> str | None:
    """How a block statistic moved, if it moved one way (Mann-Kendall) by enough (Sen): for a
    mean, DRIFT_SHARE of `unit`; for a spread (`unit` None), DRIFT_SHARE of its median."""
    finite = np.isfinite(series)
    if int(finite.sum()) < DRIFT_BLOCKS // 2:
        return None
    x, y = np.flatnonzero(finite).astype(float), series[finite]
    tau = stats.kendalltau(x, y)
    if not tau.pvalue < DRIFT_SIGNIFICANCE:
        return None
    change = float(stats.theilslopes(y, x).slope) * (DRIFT_BLOCKS - 1)
    scale = float(np.median(y)) if unit is None else unit
    if not abs(change) >= DRIFT_SHARE * abs(scale) or scale == 0:
        return None
    if unit is None:
        return f"{'grew' if change > 0 else 'shrank'} by {abs(change) / scale:.0%}"
    return f"moved by {change:+.4g}"


def relearned_from_history(
    running: LearnedModel,
    readings: Readings,
    *,
    covered: Sequence[tuple[int, int | None]],
    false_alarms_per_day: float,
    lstm: bool,
) -> LearnedModel:
    """The stream learned again from one stream's stored readings (`covered`: its alarm
    spans), as its first learning learned it, on the normal readings only; a DriftError if
    they may hide a slow fault (`running`: the model the stream runs, whose residuals and
    level threshold the guard reads)."""
    count = int(readings.counts[0])
    normal = normal_readings(count, covered)
    result = running.forecast(readings)
    level = next((d.threshold for d in running.monitor.detectors if d.kind == "level"), None)
    why = drift(
        np.where(result.monitored[:, None], result.residuals, np.nan),
        None if readings.references is None else result.reference_gap,
        normal & result.monitored,
        level_threshold=level,
    )
    if why is not None:
        raise DriftError(why)
    return learn(
        readings.times,
        readings.values,
        sample_period_s=running.sample_period_s,
        false_alarms_per_day=false_alarms_per_day,
        references=readings.references,
        lstm=lstm,
        normal=normal,
    )


@dataclass(frozen=True)
class Verdict:
    """A candidate's proof against the running model on the same readings."""

    promoted: bool
    reason: str
    running_rmse: float | None
    candidate_rmse: float | None
    running_incidents: int
    candidate_incidents: int


def verdict(running: Run, candidate: Run) -> Verdict:
    """Whether the candidate takes over: a clearly lower forecast error than the running
    model's (`CLEARLY_LOWER`) and no more incidents, over the same proving readings."""
    ours = len(incident_spans(running.events))
    theirs = len(incident_spans(candidate.events))
    old, new = running.residual_rmse, candidate.residual_rmse
    if new is None or old is None:
        promoted, reason = False, "the proving period held no monitored reading"
    elif not new <= CLEARLY_LOWER * old:
        promoted, reason = False, f"its forecast error {new:.4g} is not clearly below {old:.4g}"
    elif theirs > ours:
        promoted, reason = False, f"it raised {theirs} incident(s) against {ours}"
    else:
        promoted = True
        reason = f"forecast error {new:.4g} against {old:.4g}, {theirs} incident(s) against {ours}"
    return Verdict(promoted, reason, old, new, ours, theirs)
