"""A learned stream's detectors and thresholds, from its learning readings' residuals.

Each detector gets a share of the stream's false-alarm budget (false alarms per day), split
evenly between the detector families (as if it had them all) and then between the channels one
watches. The budget is an upper bound, not a quota: however slow the stream (a reading every
five minutes makes 288 a day, so one false alarm a day would be one reading in 300), no test
alarms on a statistic that normal readings reach more often than once in `LEAST_SURPRISE`
(1 in 10,000) readings: ordinary surprises are not worth an operator's attention, whatever
the budget would allow. A threshold is the highest of three numbers, so that a short learning
period can only make it stricter, never laxer, than what the data show:

- the prior: where the statistic would cross the budget if the residuals were Gaussian with
  the scale the learning readings show (for a windowed statistic, correlated residuals widen
  it: the long-run variance of their mean is estimated from their autocorrelation, in-sample
  and held out, taking the larger, one sigma up; the shift detector's allows for the learned
  level's own uncertainty too);
- the tail: a generalised Pareto tail fitted to the largest tenth of the learning statistics
  (peaks over threshold), its shape shrunk towards the exponential tail's 0 when the excesses
  are few and kept within [0, 0.5], its scale towards the prior's, extrapolated to the budget;
- the largest value the learning readings produced: they are normal by definition.

The residual scale is the larger of the half-width of the residuals' central 68% (sigma for a
Gaussian, undisturbed by a sixth of outliers) and their mean absolute deviation times
sqrt(pi / 2) (sigma for a Gaussian too, and not zero for a sensor whose readings sit on one
value most of the time and step away now and then, where the central 68% is all zeros), the
larger of its in-sample and held-out estimates, floored by half the sensor's resolution (the
smallest non-zero change it has shown: a quantised reading's rounding error) and by 1e-12 of
its level, so a flat or integer series has a finite scale. Thresholds are written as gains
(1 / threshold) with the detector's threshold 1: a learned stream's statistics read as
multiples of their thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import stats

from app.monitoring.alarms import AlarmPolicy
from app.monitoring.config import (
    DetectorConfig,
    FrozenConfig,
    LevelConfig,
    MahalanobisConfig,
    MissingConfig,
    MonitorConfig,
    PointConfig,
    RollingRMSConfig,
    ShiftConfig,
)

SECONDS_PER_DAY = 86_400.0
LEARNED_DETECTORS = (
    "point",
    "shift",
    "rolling_rms",
    "frozen",
    "mahalanobis",
    "level",
    "missing",
)
"""Every detector a learned stream may get (which it does get depends on its readings)."""
SHIFT_WINDOW = 10
"""Readings the shift detector averages: a level change is confirmed within ten readings."""
RMS_WINDOW = 50
RMS_LONG_WINDOW = 200
RMS_LONG_LEARNING = 10_000
"""The rolling RMS averages `RMS_LONG_WINDOW` readings once the learning holds this many (a
relearning on a stream's history, or a long learning period): a window four times longer
spreads half as much in normal operation, so a sustained rise in the residual energy (a
machine vibrating harder) too small for 50 readings to tell from a normal day's swings stands
out; short bursts of energy are the point and shift detectors' to see. Its statistic is
smoother and swings more slowly, so it takes 50 of its windows, not 20, to show how far it
swings in normal operation."""
FLOOR_WINDOW = 20
LEVEL_WINDOW = 10
MISSING_WINDOW = 10
QUIET_TO_CLOSE = 5
"""Readings back inside its threshold before an alarm closes: the alarm state follows the
machine closely; a fault that dips under a threshold for a while stays one incident (the
quiet window of app/monitoring/incidents.py joins them)."""
CLEAR = 0.6
"""An open alarm counts a reading as back to normal only once its statistic is below 60 % of the
way from where it rests in normal operation up to its threshold (hysteresis, as a thermostat or
a protection relay has): a fault whose statistic hovers about its threshold stays one alarm,
instead of one alarm each time it crosses. The rolling RMS rests where the channel's noise puts
it: its resting level is the median of its learning windows' RMS (the highest among the
channels, as a share of their thresholds), so it never has to fall below where normal noise
sits to close. Chosen across the plant, spacecraft, pump and synthetic sets
together, never per set."""
RMS_SMALLEST_RISE = math.sqrt(2.0)
"""The rolling RMS alarms on no less than a doubling of the residual variance: real noise
levels wander by tens of percent."""
WINDOWS_TO_CHARACTERISE = 20
"""A windowed detector runs only if the learning readings hold 20 of its windows: fewer cannot
tell how much a window's statistic varies in normal operation (the rolling RMS over 50 readings
needs 1,000 learning readings). The variance floor, which alarms below the smallest spread
the learning saw (halved), makes do with 10 of its windows (200 readings)."""
TAIL_FRACTION = 0.1
PSEUDO_EXCESSES = 10.0
SHAPE_PSEUDO_EXCESSES = 200.0
FLOOR_FRACTION = 0.01
"""A frozen sensor: the spread of a window of its readings below a hundredth of the smallest
the learning saw. A sensor that merely turns quiet is a change of regime, not a frozen sensor:
the other detectors judge it."""
OFTEN_STILL = 0.25
"""A sensor that repeats its last reading this often while learning (a quantised or slow one)
sits still in normal operation too: it is not watched for freezing."""
MEAN_DEVIATION = math.sqrt(math.pi / 2)
"""sigma over the mean absolute deviation, for a Gaussian."""
LEAST_SURPRISE = 1e-4
"""The most often, per reading, that normal readings may cross any one threshold, whatever
the budget would allow (see the module)."""


@dataclass(frozen=True)
class ChannelScale:
    scale: float
    resolution: float


def rms_window_for(count: int) -> int:
    """The rolling RMS's window for `count` learning readings (see `RMS_LONG_LEARNING`)."""
    return RMS_LONG_WINDOW if count >= RMS_LONG_LEARNING else RMS_WINDOW


def residual_scale(residuals: np.ndarray, values: np.ndarray, level: float) -> ChannelScale:
    """The scale of one channel's residuals with its floors (see the module)."""
    finite = residuals[~np.isnan(residuals)]
    spread = 0.0
    if finite.size >= 2:
        low, high = np.percentile(finite, [15.865, 84.135])
        deviation = float(np.abs(finite - np.median(finite)).mean())
        spread = max(float(high - low) / 2, MEAN_DEVIATION * deviation)
    steps = np.abs(np.diff(values[~np.isnan(values)]))
    steps = steps[steps > 0]
    resolution = float(steps.min()) if steps.size else 0.0
    floor = max(resolution / 2, 1e-12 * abs(level), 1e-300)
    return ChannelScale(scale=max(spread, floor), resolution=resolution)


def _long_run_factor(z: np.ndarray, window: int, unknown: float | None = None) -> float:
    """Var(mean of `window` residuals) x window / var(residual), from the autocorrelation of
    the standardised residuals `z` (NaN-free runs), between 1 and `window`; `unknown` (default
    halfway, in log, to fully correlated) when too few to tell."""
    z = z[~np.isnan(z)]
    if z.size < 3 * window:
        return math.sqrt(window) if unknown is None else unknown
    z = z - z.mean()
    variance = float(z @ z) / z.size or 1.0
    total = 1.0
    for lag in range(1, window):
        rho = float(z[lag:] @ z[:-lag]) / z.size / variance
        total += 2 * (1 - lag / window) * rho
    return min(max(total, 1.0), float(window))


def _tail(sample: np.ndarray, rate: float, prior_scale: float) -> float:
    """The peaks-over-threshold estimate of the level exceeded with probability `rate`: a
    generalised Pareto tail fitted (probability-weighted moments) to the excesses over the
    sample's 90th percentile. Its shape is shrunk towards 0 (the exponential tail) with
    `SHAPE_PSEUDO_EXCESSES` pseudo-excesses and kept within [0, 0.5]: a few dozen excesses say
    little about it, thousands say a lot; never lighter than exponential. Its scale is shrunk
    towards `prior_scale` with `PSEUDO_EXCESSES`. NaN if the sample is too small."""
    sample = np.sort(sample[~np.isnan(sample)])
    if sample.size < 50:
        return math.nan
    start = int(sample.size * (1 - TAIL_FRACTION))
    level = float(sample[start - 1])
    excesses = sample[start:] - level
    count = excesses.size
    fraction = count / sample.size
    if rate >= fraction:
        return level
    mean = float(excesses.mean())
    weights = (count - 1 - np.arange(count)) / max(count - 1, 1)
    a1 = float((weights * excesses).mean())
    shape = 0.0
    if mean > 0 and mean - 2 * a1 > 0:
        shape = 2 - mean / (mean - 2 * a1)
    shape = min(max(shape * count / (count + SHAPE_PSEUDO_EXCESSES), 0.0), 0.5)
    # The scale that gives the excesses their mean (sigma / (1 - shape)), shrunk likewise.
    scale = (count * mean + PSEUDO_EXCESSES * prior_scale) / (count + PSEUDO_EXCESSES)
    scale *= 1 - shape
    ratio = fraction / rate
    if shape < 1e-9:
        return level + scale * math.log(ratio)
    return level + scale / shape * (math.pow(ratio, shape) - 1)


def _highest(statistics: np.ndarray, prior: float, rate: float, tail_prior: float) -> float:
    """A threshold: the highest of the prior, the tail fitted to the learning statistics
    (`_tail`, its scale shrunk towards `tail_prior`) and the largest statistic they reached."""
    seen = statistics[~np.isnan(statistics)]
    observed = float(seen.max()) if seen.size else 0.0
    return max(prior, _finite_or(_tail(seen, rate, tail_prior), 0.0), observed)


def _rolling(values: np.ndarray, window: int) -> np.ndarray:
    """(T, window) windows of a 1-D series (none if shorter)."""
    if values.shape[0] < window:
        return np.empty((0, window))
    return sliding_window_view(values, window)


def detectors_for(
    residuals: np.ndarray,
    values: np.ndarray,
    levels: list[float],
    *,
    missing: np.ndarray,
    sample_period_s: float,
    false_alarms_per_day: float,
    reference_gaps: np.ndarray | None = None,
    unseen: list[np.ndarray] | None = None,
    rms_window: int | None = None,
) -> tuple[MonitorConfig, list[ChannelScale]]:
    """The monitor of a learned stream: residuals (R, C) of its learning readings (NaN where
    none), its readings (R, C), each channel's level, which readings were null (R,), for a
    stream with a reference sensor the gaps between channel 0 and it (R,), and each channel's
    residuals on readings its model did not see while fitted (the hold-out). `rms_window`: the
    rolling RMS's (a revision keeps the stream's); None: the longest the readings characterise.

    A model fitted on a few hundred readings fits them better than it will forecast the next
    ones: its residuals there are smaller and less correlated. The scale and the correlation
    that widen the thresholds are each the larger of the two estimates, in-sample and
    held-out."""
    readings_per_day = SECONDS_PER_DAY / sample_period_s
    count, channels = residuals.shape
    held = unseen if unseen is not None else [np.empty(0)] * channels
    scales = []
    for c in range(channels):
        inside = residual_scale(residuals[:, c], values[:, c], levels[c])
        outside = residual_scale(held[c], values[:, c], levels[c])
        scales.append(inside if inside.scale >= outside.scale else outside)
    # (the window from the readings that may teach: `missing` is NaN on the others)
    usable = int(np.isfinite(missing).sum())
    rms_length = rms_window if rms_window is not None else rms_window_for(usable)
    with_rms = count >= WINDOWS_TO_CHARACTERISE * rms_length
    with_level = (
        reference_gaps is not None
        and int(np.isfinite(reference_gaps).sum()) >= WINDOWS_TO_CHARACTERISE * LEVEL_WINDOW / 2
    )
    # The budget is shared evenly as if the stream had every family: point, shift, rolling
    # RMS, variance floor and missing, Mahalanobis for several channels, level for a reference.
    # One left off (too few readings to characterise it) does not hand its share to the
    # others: a short learning period is no reason for looser thresholds.
    families = 5 + int(channels > 1) + int(reference_gaps is not None)
    share = false_alarms_per_day / families

    def budget_rate(window: int, watched: int) -> float:
        """The probability a reading's statistic may exceed: the family's share of events a
        day, each about `window` readings long, over the readings of a day."""
        return min(LEAST_SURPRISE * window, share / watched * window / readings_per_day)

    point_gains, shift_gains, rms_gains, floor_gains = [], [], [], []
    rms_resting: list[float] = []  # where each channel's RMS times its gain sits while learning
    for c, scale in enumerate(scales):
        r = residuals[:, c]
        s = scale.scale
        z = r / s
        rate = budget_rate(1, channels)
        prior = s * float(stats.norm.isf(rate / 2))
        point_gains.append(1.0 / _highest(np.abs(r), prior, rate, s / max(prior / s, 1.0)))

        factor = max(
            _long_run_factor(z, SHIFT_WINDOW), _long_run_factor(held[c] / s, SHIFT_WINDOW, 1.0)
        )
        # An autocorrelation estimated from n readings errs low by about sqrt(4 w / 3 n)
        # (relative): the factor one sigma up.
        factor *= 1 + math.sqrt(4 * SHIFT_WINDOW / (3 * max(count, 1)))
        windows = _rolling(r, SHIFT_WINDOW)
        means = np.abs(windows.mean(axis=1)) if windows.size else np.empty(0)
        rate = budget_rate(SHIFT_WINDOW, channels)
        # The level the model learned is uncertain too: by the mean of the learning readings'
        # residuals, as correlated as they are.
        spread = s * math.sqrt(factor / SHIFT_WINDOW + factor / max(count, 1))
        prior = spread * float(stats.norm.isf(rate / 2))
        tail_prior = spread / max(prior / spread, 1.0)
        shift_gains.append(1.0 / _highest(means, prior, rate, tail_prior))

        factor = max(
            _long_run_factor(z * z - 1, rms_length),
            _long_run_factor((held[c] / s) ** 2 - 1, rms_length, 1.0),
        )
        windows = _rolling(r * r, rms_length)
        rms = np.sqrt(windows.mean(axis=1)) if windows.size else np.empty(0)
        rate = budget_rate(rms_length, channels)
        prior = s * max(
            RMS_SMALLEST_RISE,
            math.sqrt(1 + float(stats.norm.isf(rate)) * math.sqrt(2 * factor / rms_length)),
        )
        rms_gains.append(1.0 / _highest(rms, prior, rate, s * 0.1))
        if np.isfinite(rms).any():
            rms_resting.append(float(np.nanmedian(rms)) * rms_gains[-1])

        floor_gains.append(_frozen_gain(values[:, c]))

    quiet = AlarmPolicy(k=1, n=1, m=QUIET_TO_CLOSE, clear=CLEAR)
    detectors: list[DetectorConfig] = [
        PointConfig(threshold=1.0, gains=point_gains),
        ShiftConfig(threshold=1.0, window=SHIFT_WINDOW, gains=shift_gains),
    ]
    if with_rms:
        # The hysteresis of all channels from the highest resting level among them.
        resting = max(rms_resting, default=None)
        detectors.append(
            RollingRMSConfig(
                threshold=1.0,
                window=rms_length,
                gains=rms_gains,
                resting=resting if resting is not None and resting < 1.0 else None,
            )
        )
    if count >= WINDOWS_TO_CHARACTERISE * FLOOR_WINDOW / 2 and any(floor_gains):
        detectors.append(FrozenConfig(threshold=1.0, window=FLOOR_WINDOW, gains=floor_gains))
    joint = _mahalanobis(residuals, scales, budget_rate(1, 1)) if channels > 1 else None
    if joint is not None:
        detectors.append(joint)
    if with_level and reference_gaps is not None:
        detectors.append(_level(reference_gaps, budget_rate(LEVEL_WINDOW, 1)))
    detectors.append(_missing(missing, share, readings_per_day))
    return MonitorConfig(channels=channels, alarm=quiet, detectors=detectors), scales


def _mahalanobis(
    residuals: np.ndarray, scales: list[ChannelScale], rate: float
) -> MahalanobisConfig | None:
    """The residual vector's distance from normal, over the channels that moved while the
    stream learned (a constant one is watched by itself: its scale is a floor, not a spread):
    its covariance from the learning residuals, each clipped at 5 scales (a few outliers do not
    inflate it) and shrunk towards the diagonal as far as Ledoit and Wolf's estimate says a
    learning period of that length needs. Its prior threshold is where the distance of a new
    reading falls with probability `rate` when mean and covariance were estimated from n
    readings (Hotelling's T-squared for a new observation: an F distribution, much wider than
    the chi-squared when n is not many times the channels). None with fewer than two such
    channels or too few complete readings to tell."""
    watched = [c for c, scale in enumerate(scales) if scale.resolution > 0]
    if len(watched) < 2:
        return None
    s = np.array([scales[c].scale for c in watched])
    part = residuals[:, watched]
    rows = part[~np.isnan(part).any(axis=1)] / s
    count, channels = rows.shape
    if count < 2 * channels + 10:
        return None
    clipped = np.clip(rows, -5, 5)
    centred = clipped - clipped.mean(axis=0)
    sample = centred.T @ centred / count
    target = np.diag(np.diag(sample))
    distance = float(((sample - target) ** 2).sum())
    # sum_i |x_i x_i^T - S|^2 = sum_i |x_i|^4 - n |S|^2 (the x_i x_i^T add up to n S).
    spread = float(((centred**2).sum(axis=1) ** 2).sum() - count * (sample**2).sum()) / count**2
    shrinkage = 1.0 if distance <= 0 else min(1.0, spread / distance)
    shrunk = shrinkage * target + (1 - shrinkage) * sample + 1e-6 * np.eye(channels)
    covariance = shrunk * np.outer(s, s)
    precision = np.linalg.inv(shrunk)
    distances = np.einsum("ij,jk,ik->i", rows, precision, rows)
    inflation = channels * (count + 1) * (count - 1) / (count * (count - channels))
    prior = inflation * float(stats.f.isf(rate, channels, count - channels))
    threshold = _highest(distances, prior, rate, 2.0)
    return MahalanobisConfig(threshold=threshold, covariance=covariance.tolist(), watched=watched)


def _level(gaps: np.ndarray, rate: float) -> LevelConfig:
    """The sensor against its reference: |mean of 10 gaps| beyond what the learning readings'
    gaps allow (the same prior, tail and maximum as the shift detector)."""
    finite = gaps[~np.isnan(gaps)]
    centre = float(np.median(finite)) if finite.size else 0.0
    spread = residual_scale(gaps - centre, gaps, 0.0).scale
    factor = _long_run_factor((gaps - centre) / spread, LEVEL_WINDOW)
    windows = _rolling(gaps, LEVEL_WINDOW)
    means = np.abs(windows.mean(axis=1)) if windows.size else np.empty(0)
    window_spread = spread * math.sqrt(factor / LEVEL_WINDOW)
    prior = abs(centre) + window_spread * float(stats.norm.isf(rate / 2))
    return LevelConfig(threshold=_highest(means, prior, rate, window_spread), window=LEVEL_WINDOW)


def _missing(missing: np.ndarray, share: float, readings_per_day: float) -> MissingConfig:
    """k of the last 10 readings null, k the smallest that the learning readings' null rate
    (with one pseudo-null, so a clean period does not make a single null alarming) keeps within
    the detector's share of the budget."""
    nulls, total = float(np.nansum(missing)), float((~np.isnan(missing)).sum())
    rate = (nulls + 1) / (total + 2)
    k = 1
    while (
        k < MISSING_WINDOW
        and stats.binom.sf(k - 1, MISSING_WINDOW, rate) * (readings_per_day / MISSING_WINDOW)
        > share
    ):
        k += 1
    return MissingConfig(alarm=AlarmPolicy(k=k, n=MISSING_WINDOW, m=QUIET_TO_CLOSE))


def _frozen_gain(values: np.ndarray) -> float:
    """The frozen detector's gain for one channel (1 / its floor), 0 if it is not watched: a
    sensor that sat still for a whole window while learning, or that often repeats its
    reading, does so in normal operation too."""
    finite = values[~np.isnan(values)]
    if finite.size < 2 or float(np.mean(np.diff(finite) == 0)) >= OFTEN_STILL:
        return 0.0
    windows = _rolling(values, FLOOR_WINDOW)
    spreads = windows.std(axis=1) if windows.size else np.empty(0)
    spreads = spreads[~np.isnan(spreads)]
    lowest = float(spreads.min()) if spreads.size else 0.0
    return 1.0 / (FLOOR_FRACTION * lowest) if lowest > 0 else 0.0


def _finite_or(x: float, default: float) -> float:
    return x if math.isfinite(x) else default
