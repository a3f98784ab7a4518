"""Every channel forecast from its own past: the models a stream learns for itself.

    x_c[t+1] = o_c + b_c + sum_k w_ck * (x_c[t+1-k] - o_c)

with lags k = 1, 2, ... and seasonal lags (a day, a week, a period found in the data). One
formula holds every candidate a stream chooses from (`fit_channel`):

- level: no lag, b the median of the learning readings (a stationary sensor: the best guess is
  its normal level);
- naive: w_1 = 1 (the last reading);
- seasonal naive: w_m = 1 (the reading one period ago);
- autoregression: lags 1..p (plus m and m + 1 with a period), ridge least squares with an
  intercept, mean-reverting;
- autoregression of the changes: x[t+1] - x[t] regressed on the last changes (plus the change one
  period ago), which never pulls a wandering level back: for sensors whose level drifts more
  than their steps explain (temperatures, counters).

`o_c` is a reference level (the learning readings' median) subtracted before the sums, so
readings near 1e9 keep their precision. All channels are forecast (`targets` = n_channels),
each from its own history only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Self

import numpy as np
from scipy import signal

from app.forecasting.base import Forecaster

ChannelKind = Literal["level", "naive", "seasonal-naive", "ar", "ar-differenced"]
SIMPLICITY: tuple[ChannelKind, ...] = ("level", "naive", "seasonal-naive", "ar", "ar-differenced")
"""Candidates from the simplest; a simpler one is kept unless a later one is clearly better."""

AR_ORDER = 5
"""Lags of the autoregression (5 steps: short memory; seasonality comes through seasonal lags)."""
DIFFERENCED_ORDER = 3
RIDGE = 0.01
"""Ridge penalty, relative to the lagged values' variance: keeps a short learning period's
regression from chasing noise, costs nothing when the data say more."""
CLEARLY_BETTER = 1.1
"""A more complex candidate replaces a simpler one only when its hold-out mean squared error is
more than 10% lower: short hold-outs are noisy, simpler models fail more gracefully."""
HOLDOUT = 0.25
"""The share of the learning readings every candidate is scored on, fitted on the rest."""
GROWTH_STEPS = 2048
"""Readings ahead to which a forecast's error growth is tabled (beyond: its last value)."""
HELD_KINDS = frozenset({"level", "seasonal-naive", "ar"})
"""The models with a normal to hold to while an alarm is open (`LaggedLinear.spread_growth`)."""
PERSISTENT = 4.0
"""A sensor whose hold-out error about its level exceeds 4 x the naive forecast's error wanders
(its lag-1 correlation is above about 0.875): it is forecast from its last readings, never
pulled back to a level the learning period happened to see."""


@dataclass(frozen=True)
class ChannelFit:
    """One channel's chosen model and how it did on the learning readings' held-out tail."""

    kind: ChannelKind
    lags: tuple[int, ...]
    weights: tuple[float, ...]
    intercept: float
    offset: float
    validation_rmse: float
    naive_rmse: float
    period: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "lags": list(self.lags),
            "weights": list(self.weights),
            "intercept": self.intercept,
            "offset": self.offset,
            "validation_rmse": _number(self.validation_rmse),
            "naive_rmse": _number(self.naive_rmse),
            "period": self.period,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ChannelFit:
        return cls(
            kind=raw["kind"],
            lags=tuple(int(k) for k in raw["lags"]),
            weights=tuple(float(w) for w in raw["weights"]),
            intercept=float(raw["intercept"]),
            offset=float(raw["offset"]),
            validation_rmse=_float(raw.get("validation_rmse")),
            naive_rmse=_float(raw.get("naive_rmse")),
            period=None if raw.get("period") is None else int(raw["period"]),
        )

    def forecast(self, series: np.ndarray) -> np.ndarray:
        """One-step forecasts of a 1-D series: out[t] forecasts series[t] (NaN without the lags
        it needs)."""
        out = np.full(series.shape[0], np.nan)
        deepest = max(self.lags, default=0)
        if series.shape[0] <= deepest:
            return out
        total = np.full(series.shape[0] - deepest, self.intercept + self.offset)
        for lag, weight in zip(self.lags, self.weights, strict=True):
            total = total + weight * (series[deepest - lag : series.shape[0] - lag] - self.offset)
        out[deepest:] = total
        return out


def _number(x: float) -> float | None:
    return None if x != x else x


def _float(x: Any) -> float:
    return float("nan") if x is None else float(x)


class LaggedLinear(Forecaster):
    """Each channel's `ChannelFit`, forecasting all channels at once."""

    kind = "lagged-linear"

    def __init__(self, fits: list[ChannelFit]) -> None:
        if not fits:
            raise ValueError("a lagged-linear forecaster needs at least one channel")
        deepest = max((max(fit.lags, default=0) for fit in fits), default=0)
        super().__init__(window=max(1, deepest), horizon=1, n_channels=len(fits))
        self.fits = list(fits)

    @property
    def targets(self) -> int:
        return self.n_channels

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        raise NotImplementedError("a stream learns its lagged-linear model: see app/learning")

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        # The window ends with the latest reading: lag k sits at position window - k.
        out = np.empty((windows.shape[0], self.n_channels))
        for channel, fit in enumerate(self.fits):
            total = np.full(windows.shape[0], fit.intercept + fit.offset)
            for lag, weight in zip(fit.lags, fit.weights, strict=True):
                total = total + weight * (windows[:, self.window - lag, channel] - fit.offset)
            out[:, channel] = total
        return out

    def advance(
        self, history: np.ndarray, rows: np.ndarray, carry: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Straight from the readings by lag (no window copied per reading: a weekly lag would
        copy thousands); the same additions in the same order as `_predict`."""
        count, steps = rows.shape[:2]
        out = np.empty((count, steps, self.n_channels))
        if steps == 0:
            return out, carry
        extended = np.concatenate((history, rows), axis=1)  # (B, W + T, C)
        # After rows[:, t] (extended index W + t), lag k is extended index W + t + 1 - k.
        for channel, fit in enumerate(self.fits):
            total = np.full((count, steps), fit.intercept + fit.offset)
            for lag, weight in zip(fit.lags, fit.weights, strict=True):
                start = self.window + 1 - lag
                total = total + weight * (extended[:, start : start + steps, channel] - fit.offset)
            out[:, :, channel] = total
        return out, carry

    def spread_growth(self, steps: int) -> np.ndarray:
        """Per channel (see `Forecaster.spread_growth`), for the channels whose model has a
        normal to hold to: 1 for the level and the seasonal naive forecast (the season before
        the held readings is as good a guess as the last one), and for a mean-reverting
        autoregression sqrt(the sum of its squared impulse response over `steps` readings),
        bounded. NaN for a sensor that wanders (naive, autoregression of the changes, or an
        autoregression that does not revert): it has no normal level to return to, and its
        readings always enter the history."""
        table = self._variance_growth
        growth = np.sqrt(table[min(max(steps, 1), GROWTH_STEPS)])
        return np.where(self._holds, growth, np.nan)

    @cached_property
    def _holds(self) -> np.ndarray:
        table = self._variance_growth
        stationary = table[-1] < 4 * table[GROWTH_STEPS // 2]
        kinds = np.array([fit.kind in HELD_KINDS for fit in self.fits])
        held: np.ndarray = kinds & (stationary | np.array([fit.kind != "ar" for fit in self.fits]))
        return held

    @cached_property
    def _variance_growth(self) -> np.ndarray:
        """(GROWTH_STEPS + 1, channels): row h the sum of the squared impulse response of each
        channel's recursion over h readings (row 0 unused); 1 throughout for the level and
        the seasonal naive forecast."""
        table = np.ones((GROWTH_STEPS + 1, self.n_channels))
        impulse = np.zeros(GROWTH_STEPS)
        impulse[0] = 1.0
        for channel, fit in enumerate(self.fits):
            if fit.kind != "ar":
                continue
            recursion = np.zeros(max(fit.lags, default=0) + 1)
            recursion[0] = 1.0
            for lag, weight in zip(fit.lags, fit.weights, strict=True):
                recursion[lag] -= weight
            with np.errstate(over="ignore", invalid="ignore"):
                psi = signal.lfilter([1.0], recursion, impulse)
                growth = np.cumsum(psi * psi)
            table[1:, channel] = np.minimum(np.nan_to_num(growth, nan=1e12, posinf=1e12), 1e12)
        return table

    def config(self) -> dict[str, Any]:
        return {**super().config(), "fits": [fit.as_json() for fit in self.fits]}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LaggedLinear:
        return cls([ChannelFit.from_json(raw) for raw in config["fits"]])


# --- fitting one channel -----------------------------------------------------------------------


def _ridge(
    series: np.ndarray, lags: list[int], target: np.ndarray | None = None
) -> tuple[np.ndarray, float] | None:
    """Ridge least squares of series[t] (or target[t]) on series[t - k], k in lags, with an
    intercept; rows with a NaN left out. None if too few rows."""
    deepest = max(lags)
    y = (series if target is None else target)[deepest:]
    design = np.column_stack([series[deepest - k : series.shape[0] - k] for k in lags])
    keep = ~np.isnan(design).any(axis=1) & ~np.isnan(y)
    if keep.sum() < 2 * len(lags) + 5:
        return None
    design, y = design[keep], y[keep]
    centre, level = design.mean(axis=0), y.mean()
    centred = design - centre
    variance = float(centred.var()) or 1.0
    gram = centred.T @ centred + RIDGE * len(y) * variance * np.eye(len(lags))
    weights = np.linalg.solve(gram, centred.T @ (y - level))
    return weights, float(level - centre @ weights)


def _candidates(
    series: np.ndarray, periods: list[int]
) -> dict[str, tuple[ChannelKind, list[int], np.ndarray, float, int | None]]:
    """Each candidate fitted on `series` (its reference level already subtracted): name ->
    (kind, lags, weights, intercept, period)."""
    out: dict[str, tuple[ChannelKind, list[int], np.ndarray, float, int | None]] = {}
    finite = series[~np.isnan(series)]
    level = float(np.median(finite)) if finite.size else 0.0
    out["level"] = ("level", [], np.empty(0), level, None)
    out["naive"] = ("naive", [1], np.ones(1), 0.0, None)
    for every in periods:
        out[f"seasonal-naive/{every}"] = ("seasonal-naive", [every], np.ones(1), 0.0, every)
    seasons: list[int | None] = [None, *periods]
    for period in seasons:
        lags = list(range(1, AR_ORDER + 1)) + ([] if period is None else [period, period + 1])
        fitted = _ridge(series, lags)
        if fitted is not None:
            out[f"ar/{period}"] = ("ar", lags, fitted[0], fitted[1], period)
        changes = np.diff(series, prepend=np.nan)
        lags = list(range(1, DIFFERENCED_ORDER + 1)) + ([] if period is None else [period])
        fitted = _ridge(changes, lags)
        if fitted is not None:
            # x[t] = x[t-1] + sum_j phi_j (x[t-j] - x[t-j-1]): as weights on the levels. No
            # drift term: a learning period's trend is not extrapolated for ever.
            phi, weights = fitted[0], {1: 1.0}
            for lag, coefficient in zip(lags, phi, strict=True):
                weights[lag] = weights.get(lag, 0.0) + coefficient
                weights[lag + 1] = weights.get(lag + 1, 0.0) - coefficient
            ordered = sorted(weights)
            out[f"ar-differenced/{period}"] = (
                "ar-differenced",
                ordered,
                np.array([weights[k] for k in ordered]),
                0.0,
                period,
            )
    return out


def holdout_split(count: int) -> int:
    """Where the held-out tail of `count` learning readings starts."""
    return round(count * (1 - HOLDOUT))


def fit_channel(series: np.ndarray, periods: list[int]) -> tuple[ChannelFit, np.ndarray]:
    """Choose one channel's model on its learning readings (NaN: missing): every candidate is
    fitted on the first part, scored by one-step error on the held-out tail, the simplest of
    those not clearly beaten is kept and refitted on all of it. Returns it and its residuals on
    the held-out tail as fitted without it: how its errors look on readings it has not seen."""
    finite = series[~np.isnan(series)]
    if finite.size == 0:
        raise ValueError("a channel has no reading to learn from")
    offset = float(np.median(finite))
    centred = series - offset
    split = holdout_split(series.shape[0])
    train, errors, unseen = centred[:split], {}, {}
    for name, (kind, lags, weights, intercept, _) in _candidates(train, periods).items():
        fit = ChannelFit(kind, tuple(lags), tuple(weights.tolist()), intercept, 0.0, 0.0, 0.0)
        unseen[name] = centred[split:] - fit.forecast(centred)[split:]
        error = unseen[name] ** 2
        if np.isfinite(error).sum() >= 5:
            errors[name] = (float(np.nanmean(error)), kind)
    naive_mse = errors["naive"][0] if "naive" in errors else np.nan
    allowed = dict(errors)
    if "level" in errors and naive_mse == naive_mse and errors["level"][0] > PERSISTENT * naive_mse:
        allowed = {n: e for n, e in errors.items() if e[1] not in ("level", "ar")}
    if not allowed:  # too short to hold anything out: the level
        allowed = {"level": (np.nan, "level")}
    best = min((e[0] for e in allowed.values() if e[0] == e[0]), default=np.nan)
    chosen = next(
        name
        for kind in SIMPLICITY
        for name, (mse, k) in sorted(allowed.items())
        if k == kind and (best != best or mse <= CLEARLY_BETTER * best)
    )
    kind, lags, weights, intercept, period = _candidates(centred, periods)[chosen]
    fit = ChannelFit(
        kind=kind,
        lags=tuple(lags),
        weights=tuple(float(w) for w in weights),
        intercept=float(intercept),
        offset=offset,
        validation_rmse=float(np.sqrt(errors[chosen][0])) if chosen in errors else float("nan"),
        naive_rmse=float(np.sqrt(naive_mse)),
        period=period,
    )
    return fit, unseen.get(chosen, np.empty(0))
