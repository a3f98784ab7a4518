"""Thresholds from held-out NORMAL operation, never from the training period (whose residuals
are optimistically small).

Two ways:

- `calibrate_margins`: fixed margins on the hold-out's extremes: point 4 sigma (sigma: the
  hold-out residuals' standard deviation); rolling RMS 1.1 x its hold-out maximum;
  variance floor 0.5 x the hold-out minimum of the rolling std; CUSUM limit 1.5 x its hold-out
  maximum; level and Mahalanobis 1.1 x their hold-out maximum (the 100% empirical quantile with
  the rolling RMS margin).
- `calibrate_rate`: thresholds for a target number of false-alarm EVENTS per day, shared equally
  between the detectors. Residuals are autocorrelated, so exceedances cluster: a rate of
  per-sample exceedances says little about events. Every count here runs the real alarm rule
  (persistence and clear) over the hold-out statistic, so an event is exactly what the monitor
  would raise. When the hold-out holds at least `MIN_EVENTS` events at the target rate the
  threshold is that empirical level. Otherwise the hold-out cannot resolve the rate (1,000 samples
  at 10 Hz is 100 s; one event a day is a 1-in-864,000 thing): the event peaks over a lower
  threshold u0 (declustered by the clear rule) are fitted with a generalised Pareto distribution
  and the threshold is extrapolated to rate(u) = rate(u0) * P(peak > u). The report says which,
  what rate the hold-out supports, and how much the answer moves with the tail size.

The CUSUM statistic is computed here without its restart-after-signal (its limit is what is being
sought). Up to its first crossing of any limit the restarted recursion is the same, so an event
is counted exactly when an excursion first crosses; only re-crossings within one excursion, rare
this far in the tail, are not.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.errors import DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule, RuleState
from app.monitoring.config import (
    CusumConfig,
    DetectorConfig,
    LevelConfig,
    MahalanobisConfig,
    MonitorConfig,
    PointConfig,
    RollingRMSConfig,
    VarianceFloorConfig,
    build_detector,
)
from app.monitoring.detectors import Direction, FloatArray, cusum_kappa
from app.monitoring.monitor import Monitor

SECONDS_PER_DAY = 86400.0
MIN_EVENTS = 10
"""An empirical event rate needs this many events in the hold-out; fewer, and the tail is fitted."""

_NEVER = 1e300  # a threshold no statistic reaches: for computing statistics only
_NEVER_BELOW = 5e-324  # the smallest positive threshold: for a detector alarming below it
CUSUM_CLIP = 9.0  # bounded CUSUM evidence per sample: 3 sigma (see CusumDetector)


@dataclass(frozen=True)
class Margins:
    """Fixed margins on the hold-out's extremes (when no false-alarm rate is asked for)."""

    point_sigmas: float = 4.0
    rms_factor: float = 1.1
    floor_factor: float = 0.5
    cusum_factor: float = 1.5
    level_factor: float = 1.1
    mahalanobis_factor: float = 1.1


@dataclass(frozen=True)
class DetectorSettings:
    """Everything about the detectors but their thresholds."""

    rms_window: int = 50
    floor_window: int = 20
    level_window: int = 10
    cusum_kappa: float = field(default_factory=cusum_kappa)
    cusum_clip: float | None = CUSUM_CLIP
    alarm: AlarmPolicy = field(default_factory=AlarmPolicy)


@dataclass(frozen=True)
class HoldOut:
    """What the detectors see of a record, and which of it is held-out normal operation.

    `residuals` (N,) or (N, C): the detectors' input at each reading of the record, NaN where
    they see nothing (warm-up, a missing reading: `MonitoredRecord.inputs`); `reference_gaps`
    (value - reference) enables the level detector, more than one residual channel the
    Mahalanobis detector. The detectors run over the whole record, as a live stream of it
    would; the thresholds come from their statistics over [start, stop) only.
    `description` says where the data came from.
    """

    residuals: FloatArray
    reference_gaps: FloatArray | None = None
    start: int = 0
    stop: int | None = None
    description: dict[str, Any] = field(default_factory=dict)

    @property
    def matrix(self) -> FloatArray:
        r = np.asarray(self.residuals, dtype=np.float64)
        return r[:, None] if r.ndim == 1 else r

    @property
    def span(self) -> slice:
        return slice(self.start, self.matrix.shape[0] if self.stop is None else self.stop)

    @property
    def channels(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def valid_samples(self) -> int:
        return int((~np.isnan(self.matrix[self.span, 0])).sum())


def _sigma(holdout: HoldOut) -> float:
    r = holdout.matrix[holdout.span, 0]
    r = r[~np.isnan(r)]
    if r.shape[0] < 2 or not np.all(np.isfinite(r)):
        raise DataError("the hold-out has fewer than 2 finite residuals")
    sigma = float(np.std(r))
    if sigma <= 0:
        raise DataError("the hold-out residuals are constant: nothing to calibrate on")
    return sigma


def _covariance(holdout: HoldOut) -> FloatArray:
    matrix = holdout.matrix[holdout.span]
    rows = matrix[~np.isnan(matrix).any(axis=1)]
    if rows.shape[0] <= matrix.shape[1]:
        raise DataError("the hold-out has too few complete residual vectors for a covariance")
    return np.cov(rows, rowvar=False, ddof=0)


def _placeholder_config(holdout: HoldOut, settings: DetectorSettings) -> MonitorConfig:
    """Detectors with thresholds they never reach: only their statistics are wanted."""
    sigma = _sigma(holdout)
    detectors: list[DetectorConfig] = [
        PointConfig(threshold=_NEVER),
        RollingRMSConfig(threshold=_NEVER, window=settings.rms_window),
        VarianceFloorConfig(threshold=_NEVER_BELOW, window=settings.floor_window),
        CusumConfig(
            threshold=_NEVER, sigma=sigma, kappa=settings.cusum_kappa, clip=settings.cusum_clip
        ),
    ]
    gaps = holdout.reference_gaps
    if gaps is not None and not np.all(np.isnan(gaps[holdout.span])):
        detectors.append(LevelConfig(threshold=_NEVER, window=settings.level_window))
    if holdout.channels > 1:
        detectors.append(
            MahalanobisConfig(threshold=_NEVER, covariance=_covariance(holdout).tolist())
        )
    return MonitorConfig(channels=holdout.channels, alarm=settings.alarm, detectors=detectors)


def holdout_statistics(
    holdout: HoldOut, settings: DetectorSettings
) -> tuple[MonitorConfig, dict[str, FloatArray]]:
    """Each detector's statistic over the hold-out: the monitor run over the whole record."""
    config = _placeholder_config(holdout, settings)
    gaps = None if holdout.reference_gaps is None else holdout.reference_gaps[None]
    monitor = Monitor(config)
    block = monitor.advance([monitor.new_state()], holdout.matrix[None], gaps, first_samples=[0])
    statistics = {kind: values[0, holdout.span] for kind, values in block.statistics.items()}
    for kind, values in statistics.items():
        if np.all(np.isnan(values)):
            raise DataError(
                f"the hold-out is too short for the {kind} detector's window "
                f"({holdout.valid_samples} valid residuals)"
            )
    return config, statistics


def margin_threshold(kind: str, statistic: FloatArray, sigma: float, margins: Margins) -> float:
    """One detector's threshold at its margin on the hold-out statistic (NaN: none)."""
    scale = {
        "rolling_rms": margins.rms_factor,
        "cusum": margins.cusum_factor,
        "level": margins.level_factor,
        "mahalanobis": margins.mahalanobis_factor,
    }
    if kind == "point":
        threshold = margins.point_sigmas * sigma
    elif kind == "variance_floor":
        threshold = margins.floor_factor * float(np.nanmin(statistic))
    else:
        threshold = scale[kind] * float(np.nanmax(statistic))
    if not threshold > 0:
        raise DataError(
            f"the hold-out gives the {kind} detector a threshold of {threshold}; "
            "is the hold-out constant?"
        )
    return threshold


def calibrate_margins(
    holdout: HoldOut,
    settings: DetectorSettings | None = None,
    margins: Margins | None = None,
) -> MonitorConfig:
    """Thresholds at fixed margins on the hold-out's extremes (`Margins`)."""
    settings = settings or DetectorSettings()
    margins = margins or Margins()
    placeholder, statistics = holdout_statistics(holdout, settings)
    sigma = _sigma(holdout)
    detectors = [
        config.model_copy(
            update={
                "threshold": margin_threshold(config.kind, statistics[config.kind], sigma, margins)
            }
        )
        for config in placeholder.detectors
    ]
    calibration = {
        "method": "margins",
        "margins": {
            "point": f"{margins.point_sigmas} x hold-out residual std",
            "rolling_rms": f"{margins.rms_factor} x hold-out maximum",
            "variance_floor": f"{margins.floor_factor} x hold-out minimum",
            "cusum": f"{margins.cusum_factor} x hold-out maximum",
            "level": f"{margins.level_factor} x hold-out maximum",
            "mahalanobis": f"{margins.mahalanobis_factor} x hold-out maximum",
        },
        "sigma": sigma,
        "holdout": {**holdout.description, "valid_samples": holdout.valid_samples},
    }
    return placeholder.model_copy(update={"detectors": detectors, "calibration": calibration})


# --- rate calibration ---------------------------------------------------------------------------


def _genpareto() -> Any:
    """scipy's generalised Pareto distribution, imported when a tail is fitted: scipy.stats
    costs tens of MiB that the service, which only reads thresholds, never needs."""
    from scipy.stats import genpareto

    return genpareto


@dataclass(frozen=True)
class TailFit:
    """A generalised Pareto fit to the event peaks above u0 (in alarming-side units)."""

    u0: float
    events: int
    shape: float
    scale: float

    def threshold(self, rate_per_sample: float, valid_samples: int) -> float:
        """u with rate(u) = rate(u0) * P(peak - u0 > u - u0) = the target rate."""
        exceedance = rate_per_sample * valid_samples / self.events
        return self.u0 + float(_genpareto().isf(exceedance, self.shape, 0, self.scale))


@dataclass(frozen=True)
class RateThreshold:
    """How one detector's threshold for a target event rate was found."""

    threshold: float
    method: str  # "empirical", "gpd" or "gpd, raised to the hold-out extreme"
    holdout_events: int  # events the chosen threshold raises on the hold-out itself
    fit: TailFit | None = None
    spread: tuple[float, float] | None = None  # thresholds from half and double the tail size

    def as_json(self, samples_per_day: float, valid_samples: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "threshold": self.threshold,
            "method": self.method,
            "holdout_events": self.holdout_events,
            "holdout_events_per_day": self.holdout_events * samples_per_day / valid_samples,
        }
        if self.fit is not None:
            out["tail"] = {
                "u0": self.fit.u0,
                "events_above_u0": self.fit.events,
                "u0_events_per_day": self.fit.events * samples_per_day / valid_samples,
                "gpd_shape": self.fit.shape,
                "gpd_scale": self.fit.scale,
            }
        if self.spread is not None:
            out["threshold_spread"] = list(self.spread)
        return out


class _Tail:
    """One detector's hold-out statistic, oriented so that larger is more alarming."""

    def __init__(self, statistic: FloatArray, direction: Direction, policy: AlarmPolicy) -> None:
        valid = ~np.isnan(statistic)
        self.sign = 1.0 if direction == "above" else -1.0
        self.values = self.sign * statistic[valid]
        self.sample_list = np.flatnonzero(valid).tolist()
        self.value_list = self.values.tolist()
        self.policy = policy
        self.descending = np.unique(self.values)[::-1]

    def events(self, u: float) -> list[AlarmEvent]:
        """The events the alarm rule raises above u (peaks in oriented units)."""
        rule = AlarmRule("tail", self.policy, threshold=u, direction="above")
        state = RuleState()
        _, closed = rule.observe(
            state,
            self.sample_list,
            self.value_list,
            np.flatnonzero(self.values > u).tolist(),
        )
        still_open = rule.current(state)
        return [*closed, *([] if still_open is None else [still_open])]

    def level(self, index: int) -> float:
        return float(self.descending[min(index, self.descending.shape[0] - 1)])

    def lowest_with_at_most(self, target: float) -> float:
        """The lowest threshold (among the values) raising at most `target` events."""
        good, bad = 0, max(1, int(target))
        while len(self.events(self.level(bad))) <= target:
            if bad >= self.descending.shape[0] - 1:
                return self.level(bad)
            good, bad = bad, bad * 2
        while bad - good > 1:
            middle = (good + bad) // 2
            if len(self.events(self.level(middle))) <= target:
                good = middle
            else:
                bad = middle
        return self.level(good)

    def highest_with_at_least(self, target: int) -> float:
        """The highest threshold raising at least `target` events; if none does (low levels merge
        into few long events), the probed threshold raising the most."""
        last = self.descending.shape[0] - 1
        bad, probe = 0, min(target, last)
        best, best_count = probe, -1
        while True:
            count = len(self.events(self.level(probe)))
            if count >= target:
                break
            if count > best_count:
                best, best_count = probe, count
            if probe >= last:
                return self.level(best)
            bad, probe = probe, min(probe * 2, last)
        good = probe
        while good - bad > 1:
            middle = (good + bad) // 2
            if len(self.events(self.level(middle))) >= target:
                good = middle
            else:
                bad = middle
        return self.level(good)

    def fit(self, tail_events: int) -> TailFit:
        u0 = self.highest_with_at_least(tail_events)
        peaks = np.array([e.peak for e in self.events(u0)])
        excess = peaks - u0
        if excess.shape[0] < 5:
            raise DataError(
                f"only {excess.shape[0]} alarm event(s) in the whole hold-out even at its lowest "
                "level: too few to fit a tail"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            shape, _, scale = _genpareto().fit(excess, floc=0)
        return TailFit(u0=u0, events=int(excess.shape[0]), shape=float(shape), scale=float(scale))


def tail_size(valid_samples: int) -> int:
    """Events above u0 for the GPD fit: enough to fit, few enough to be in the tail."""
    return int(min(250, max(25, valid_samples // 2000)))


def rate_threshold(
    statistic: FloatArray,
    direction: Direction,
    policy: AlarmPolicy,
    rate_per_sample: float,
) -> RateThreshold:
    """The threshold raising `rate_per_sample` alarm events per valid sample on this statistic."""
    tail = _Tail(statistic, direction, policy)
    valid = tail.values.shape[0]
    if valid == 0:
        raise DataError("no statistic on the hold-out")
    target_events = rate_per_sample * valid
    if target_events >= MIN_EVENTS:
        u = tail.lowest_with_at_most(target_events)
        method, fit, spread = "empirical", None, None
    else:
        size = tail_size(valid)
        fit = tail.fit(size)
        u = fit.threshold(rate_per_sample, valid)
        thresholds = []
        for other in (size // 2, size * 2):
            try:
                thresholds.append(tail.fit(other).threshold(rate_per_sample, valid))
            except DataError:
                continue
        spread = (min([u, *thresholds]), max([u, *thresholds]))
        method = "gpd"
        # Fewer than one expected event in the whole hold-out: a threshold the hold-out itself
        # crosses contradicts the data (a short tail fitted with a negative shape ends too soon).
        extreme = float(tail.values.max())
        if target_events < 1 and u < extreme:
            u, method = extreme, "gpd, raised to the hold-out extreme"
    held = len(tail.events(u))
    oriented = tail.sign
    return RateThreshold(
        threshold=oriented * u,
        method=method,
        holdout_events=held,
        fit=fit,
        spread=None if spread is None else _ordered(oriented * spread[0], oriented * spread[1]),
    )


def _ordered(a: float, b: float) -> tuple[float, float]:
    return (min(a, b), max(a, b))


CUSUM_BUDGET_SHARE = 0.4
"""CUSUM's share of the false-alarm budget; the other detectors split the rest equally.

Point, level and the variance floor watch large, abrupt changes: their normal tails are steep,
so their thresholds hardly move between 0.1 and 0.5 events a day. CUSUM watches small sustained
changes of residual energy (the excitation fault), which normal operation's own bursts imitate:
its threshold is the one the budget decides, so it gets the largest share. Measured on seed 1's
three hold-out days, never on the evaluation day (docs/benchmarks.md)."""


def budget_shares(kinds: list[str]) -> dict[str, float]:
    """How a false-alarm budget is divided between `kinds` (the shares sum to 1)."""
    if "cusum" not in kinds or len(kinds) == 1:
        return {kind: 1.0 / len(kinds) for kind in kinds}
    rest = (1.0 - CUSUM_BUDGET_SHARE) / (len(kinds) - 1)
    return {kind: CUSUM_BUDGET_SHARE if kind == "cusum" else rest for kind in kinds}


def calibrate_rate(
    holdout: HoldOut,
    false_alarms_per_day: float,
    *,
    sample_period_s: float,
    settings: DetectorSettings | None = None,
) -> MonitorConfig:
    """Thresholds for `false_alarms_per_day` events in total, shared as `budget_shares` says."""
    if not (false_alarms_per_day > 0 and math.isfinite(false_alarms_per_day)):
        raise DataError("--false-alarms-per-day must be a positive number")
    if not (sample_period_s > 0 and math.isfinite(sample_period_s)):
        raise DataError("--sample-period must be a positive number of seconds")
    settings = settings or DetectorSettings()
    placeholder, statistics = holdout_statistics(holdout, settings)
    samples_per_day = SECONDS_PER_DAY / sample_period_s
    shares = budget_shares([config.kind for config in placeholder.detectors])
    detectors: list[DetectorConfig] = []
    report: dict[str, Any] = {}
    for config in placeholder.detectors:
        direction = build_detector(config).direction
        values = statistics[config.kind]
        valid = int((~np.isnan(values)).sum())
        rate_per_sample = false_alarms_per_day * shares[config.kind] / samples_per_day
        try:
            found = rate_threshold(
                values, direction, config.alarm or placeholder.alarm, rate_per_sample
            )
        except DataError as exc:
            raise DataError(
                f"{config.kind}: {exc.detail}; a rate of {false_alarms_per_day:g}/day needs a "
                f"longer hold-out (this one is {holdout.valid_samples} samples, "
                f"{holdout.valid_samples / samples_per_day:.2g} days): calibrate on simulated "
                "days of normal operation"
            ) from None
        threshold = found.threshold
        if config.kind == "variance_floor" and threshold <= 0:
            raise DataError(
                "the variance floor for this rate is at or below zero: a floor that low never "
                "alarms; ask for a higher rate or give a longer hold-out"
            )
        detectors.append(config.model_copy(update={"threshold": threshold}))
        report[config.kind] = found.as_json(samples_per_day, valid)
    valid_samples = holdout.valid_samples
    supported = MIN_EVENTS * samples_per_day / valid_samples
    extrapolated = [k for k, v in report.items() if v["method"].startswith("gpd")]
    raised = [k for k, v in report.items() if "raised" in v["method"]]
    calibration = {
        "method": "false-alarm-rate",
        "false_alarms_per_day": false_alarms_per_day,
        "per_detector_per_day": {k: false_alarms_per_day * v for k, v in shares.items()},
        "sample_period_s": sample_period_s,
        "sigma": _sigma(holdout),
        "holdout": {
            **holdout.description,
            "valid_samples": valid_samples,
            "days": valid_samples / samples_per_day,
        },
        "supported_rate_per_day": supported,
        "note": (
            f"the hold-out ({valid_samples} samples, {valid_samples / samples_per_day:.3g} days) "
            f"resolves rates down to about {supported:.3g} events/day per detector "
            f"({MIN_EVENTS} events in the hold-out); "
            + (
                f"the detectors' shares are below that, so {', '.join(extrapolated)} "
                "thresholds are extrapolated with a generalised Pareto fit to the event peaks"
                if extrapolated
                else "the thresholds are empirical"
            )
            + (
                f"; {', '.join(raised)} fell inside the hold-out's own range and were raised to "
                "its extreme: the tail is too short to fit, these thresholds are not calibrated"
                if raised
                else ""
            )
        ),
        "detectors": report,
    }
    return placeholder.model_copy(update={"detectors": detectors, "calibration": calibration})


def count_events(
    statistic: NDArray[np.float64], direction: Direction, threshold: float, policy: AlarmPolicy
) -> int:
    """Number of alarm events a threshold raises on a statistic series (NaN: no statistic)."""
    tail = _Tail(statistic, direction, policy)
    return len(tail.events(tail.sign * threshold))
