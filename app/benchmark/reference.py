"""Reference detectors: what a few lines of textbook statistics catch on the same files, so the
service's figures have a floor to be read against (SKAB's leaderboard lists T-squared too).

Each learns from the same rows as the service's stream (a file's first `learn_rows`), alarms
under the same budget and is scored by the same path: its exceedances become alarms by the
service's own rule, then incidents by its own grouping. Pure numpy, one function each, from a
file's readings (rows, channels; NaN for a missing number) to a statistic per row (NaN where
there is none: the learning rows, a missing reading, a channel that cannot be standardised) and
the threshold over which a reading is an exceedance:

- `windowed_gaussian`: per channel, z = (x_t - mean) / std of the W readings before t
  (W = the learning length, so the first scored row's window is the learning rows); the
  statistic is the largest |z| over the channels. A window flatter than a billionth of the
  learning variance has no std worth dividing by (quantised channels sit still for hours):
  that channel gives no z there.
- `ar_residual`: per channel, an AR(5) with intercept fitted by least squares on the learning
  rows; the one-step residual (from the actual previous readings) over the learning
  residuals' std; the largest |z| over the channels.
- `hotelling`: files of two channels or more: T^2 of each row against the learning rows' mean
  and covariance (of the rows where every kept channel has a number), computed on standardised
  channels with the correlation shrunk 10 % towards the identity (its diagonal), plus a ridge of
  1e-6, so that 32 channels learned from 160 rows still give an invertible matrix.

Channels constant over the learning rows are dropped by every detector: no z can be formed.

Thresholds use no label and one rule for every file, the service's own: the tail probability
a reading may have is the budget (false alarms a day, the same the service gets) over the
readings a day (from the learning rows' median step, as the service measures its sample
period), and never more than the service's least surprise (`LEAST_SURPRISE`, one reading in
10,000: on slow data the budget alone would set thresholds the service itself never uses). The
per-channel detectors make one test per kept channel, so the tail is split among them
(Bonferroni) and |z| must pass the two-sided Gaussian quantile; T^2 is one test a reading,
against the chi-squared quantile with as many degrees of freedom as channels kept.

Alarms: an exceedance opens one, five readings with a statistic back under the threshold close
it (`app.monitoring.alarms.AlarmRule` with k = n = 1, m = 5); readings without a statistic are
skipped, as the service's rule skips them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.stats import chi2, norm

from app.learning.learn import sample_period
from app.learning.thresholds import LEAST_SURPRISE
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule, RuleState

AR_ORDER = 5
SHRINKAGE = 0.10
"""Hotelling: the share of the learning correlation moved to the identity."""
RIDGE = 1e-6
"""Hotelling: added to the shrunk correlation's diagonal (standardised units)."""
FLAT_WINDOW = 1e-9
"""A variance under this share of the learning rows' is flat: a trailing window's (windowed
Gaussian), the learning residuals' (AR)."""
ROUNDING = 1e-12
"""A variance under this share of the mean square is rounding, not spread."""
ALARM_POLICY = AlarmPolicy(k=1, n=1, m=5)


@dataclass(frozen=True)
class ReferenceStatistic:
    """One detector on one file: the statistic per row (NaN: none) and its threshold."""

    values: np.ndarray  # (rows,)
    threshold: float
    channels: int  # the channels it kept


StatisticFn = Callable[[np.ndarray, int, float], ReferenceStatistic]


@dataclass(frozen=True)
class Reference:
    name: str
    statistic: StatisticFn
    min_channels: int = 1


def tail_probability(times: np.ndarray, learn_rows: int, false_alarms_per_day: float) -> float:
    """The share of readings that may exceed at the budget: a day's budget over a day's readings
    (microsecond times; the learning rows' median step)."""
    budget = false_alarms_per_day * sample_period(times[:learn_rows]) / 86_400.0
    return min(LEAST_SURPRISE, budget)


def _varying(learning: np.ndarray) -> np.ndarray:
    """(channels,) bool: the channels with two different numbers among the learning rows."""
    present = ~np.isnan(learning)
    low = np.where(present, learning, np.inf).min(axis=0)
    high = np.where(present, learning, -np.inf).max(axis=0)
    return np.asarray(high > low)


def _largest(magnitudes: np.ndarray) -> np.ndarray:
    """Each row's largest value over its channels, NaN only where every channel is NaN."""
    return np.asarray(np.fmax.reduce(magnitudes, axis=1))


def _none(rows: int) -> ReferenceStatistic:
    return ReferenceStatistic(np.full(rows, np.nan), np.inf, 0)


def windowed_gaussian(values: np.ndarray, learn_rows: int, tail: float) -> ReferenceStatistic:
    """max over channels of |z| against the trailing `learn_rows` readings (see the module)."""
    values = np.asarray(values, dtype=np.float64)
    rows = values.shape[0]
    learning = values[:learn_rows]
    kept = _varying(learning)
    if not kept.any() or rows <= learn_rows:
        return _none(rows)
    # Centred on the learning mean so that the running sums keep their precision.
    centred = values[:, kept] - np.nanmean(learning[:, kept], axis=0)
    learning_variance = np.nanvar(centred[:learn_rows], axis=0)
    present = ~np.isnan(centred)
    filled = np.where(present, centred, 0.0)

    def running(a: np.ndarray) -> np.ndarray:  # running[i]: the sum of rows before i
        return np.concatenate([np.zeros((1, a.shape[1])), np.cumsum(a, axis=0)])

    now = np.arange(learn_rows, rows)
    before = now - learn_rows
    counts, sums, squares = (
        (r[now] - r[before]) for r in map(running, (present.astype(float), filled, filled**2))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = sums / counts
        variance = (squares - sums * mean) / (counts - 1)
        # A flat window's variance is rounding: of the running sums, and of squares - sums*mean.
        flat = variance <= FLAT_WINDOW * learning_variance + ROUNDING * squares / counts
        z = np.where((counts >= 2) & ~flat, (centred[now] - mean) / np.sqrt(variance), np.nan)
    statistic = np.full(rows, np.nan)
    statistic[learn_rows:] = _largest(np.abs(z))
    count = int(kept.sum())
    return ReferenceStatistic(statistic, float(norm.isf(tail / count / 2)), count)


def ar_residual(values: np.ndarray, learn_rows: int, tail: float) -> ReferenceStatistic:
    """max over channels of the AR(5) one-step residual's |z| (see the module)."""
    values = np.asarray(values, dtype=np.float64)
    rows = values.shape[0]
    if rows <= learn_rows:
        return _none(rows)
    kept = _varying(values[:learn_rows])
    z = np.full((rows, values.shape[1]), np.nan)
    for channel in np.flatnonzero(kept):
        x = values[:, channel] - np.nanmean(values[:learn_rows, channel])
        window = sliding_window_view(x, AR_ORDER + 1)  # row j: x[j] .. x[j + p], target last
        target = window[:, -1]
        at = np.arange(AR_ORDER, rows)  # the row each window predicts
        usable = ~np.isnan(window).any(axis=1)
        design = np.column_stack([np.ones(at.shape[0]), window[:, -2::-1]])  # 1, x[t-1] .. x[t-p]
        fit = usable & (at < learn_rows)
        if fit.sum() < 2 * (AR_ORDER + 1):
            kept[channel] = False
            continue
        coefficients = np.linalg.lstsq(design[fit], target[fit], rcond=None)[0]
        residual = target - np.where(usable[:, None], design, 0.0) @ coefficients
        spread = float(np.std(residual[fit], ddof=AR_ORDER + 1))
        if not spread**2 > FLAT_WINDOW * float(np.nanvar(x[:learn_rows])):
            kept[channel] = False  # the learning rows predict themselves exactly
            continue
        scored = usable & (at >= learn_rows)
        z[at[scored], channel] = residual[scored] / spread
    count = int(kept.sum())
    if not count:
        return _none(rows)
    statistic = _largest(np.abs(z[:, kept]))
    return ReferenceStatistic(statistic, float(norm.isf(tail / count / 2)), count)


def hotelling(values: np.ndarray, learn_rows: int, tail: float) -> ReferenceStatistic:
    """Hotelling's T^2 against the learning rows, a shrunk covariance (see the module)."""
    values = np.asarray(values, dtype=np.float64)
    rows = values.shape[0]
    kept = _varying(values[:learn_rows])
    complete = ~np.isnan(values[:learn_rows][:, kept]).any(axis=1)
    base = values[:learn_rows][complete]
    if base.shape[0] >= 2:
        kept &= np.std(base, axis=0) > 0  # varying, but not over the complete rows
    count = int(kept.sum())
    if base.shape[0] < 2 or not count:
        return _none(rows)
    base = base[:, kept]
    mean, scale = base.mean(axis=0), base.std(axis=0, ddof=1)
    correlation = np.atleast_2d(np.cov((base - mean) / scale, rowvar=False))
    shrunk = (1 - SHRINKAGE) * correlation + SHRINKAGE * np.diag(np.diag(correlation))
    precision = np.linalg.inv(shrunk + RIDGE * np.eye(count))
    z = (values[learn_rows:, kept] - mean) / scale
    statistic = np.full(rows, np.nan)
    statistic[learn_rows:] = np.einsum("ij,jk,ik->i", z, precision, z)  # NaN where one is
    return ReferenceStatistic(statistic, float(chi2.isf(tail, count)), count)


REFERENCES = (
    Reference("windowed_gaussian", windowed_gaussian),
    Reference("ar_residual", ar_residual),
    Reference("hotelling", hotelling, min_channels=2),
)


def alarm_events(statistic: np.ndarray, threshold: float, detector: str) -> list[AlarmEvent]:
    """A statistic's exceedances as the service's alarm rule turns them into alarms (samples:
    row numbers; the last one still open if the file ends in it)."""
    rule = AlarmRule(detector, ALARM_POLICY, threshold=threshold, direction="above")
    state = RuleState()
    samples = np.flatnonzero(~np.isnan(statistic))
    observed = statistic[samples]
    exceeding = np.flatnonzero(observed > threshold)
    _, closed = rule.observe(state, samples.tolist(), observed.tolist(), exceeding.tolist())
    still_open = rule.current(state)
    return [*closed, *([] if still_open is None else [still_open])]
