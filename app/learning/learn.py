"""What a stream learns from its first readings: its sample period, its seasons, a model of each
channel and the detectors' thresholds.

    learned = learn(times, values, false_alarms_per_day=1.0)
    learned.recurrence()          # the stream recurrence that monitors the stream from now on
    learned.to_json()             # what the database keeps (LearnedModel.from_json reads it)

Pure: numpy and scipy, no I/O. The residuals the thresholds come from are computed by the
stream recurrence itself (`app/streams/recurrence.py`), the code that will monitor the stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from app.errors import AppError, DataError
from app.forecasting.artifacts import pack_forecaster, unpack_forecaster
from app.forecasting.base import Forecaster
from app.forecasting.lagged import ChannelFit, LaggedLinear, fit_channel, holdout_split
from app.learning.network import NetworkCandidate, failed, judge, not_tried, train_network
from app.learning.thresholds import ChannelScale, detectors_for
from app.monitoring.config import MissingConfig, MonitorConfig
from app.streams.blocks import Readings, StreamResult
from app.streams.recurrence import DEFAULT_MAX_GAP, Recurrence

LEARNED_VERSION = 1
DEFAULT_LEARNING_READINGS = 1000
"""Readings a stream learns from unless told otherwise: 17 minutes at 1 Hz, 3.5 days at 5 min."""
MIN_READINGS = 100
"""The shortest learning period: fewer readings cannot hold a model and a hold-out apart."""
SEASON_STRENGTH = 0.3
"""A period is offered to the models when the readings' autocorrelation at it reaches 0.3."""
DAY_S, WEEK_S = 86_400.0, 7 * 86_400.0


def sample_period(times: np.ndarray) -> float:
    """The median step between readings (microsecond times), in seconds."""
    steps = np.diff(np.asarray(times, dtype=np.int64))
    steps = steps[steps > 0]
    if not steps.size:
        raise DataError("the learning readings need at least two distinct times")
    return float(np.median(steps)) / 1e6


def seasonal_periods(values: np.ndarray, period_s: float) -> list[int]:
    """Periods (in readings) worth offering to the models: a day and a week when the readings
    cover two of them, and the strongest peak of the autocorrelation of the detrended readings
    (at least 0.3, at most a third of the readings)."""
    count = values.shape[0]
    found: set[int] = set()
    for season in (DAY_S, WEEK_S):
        steps = round(season / period_s)
        if steps >= 2 and 2 * steps + 10 <= count:
            found.add(steps)
    series = values[~np.isnan(values)]
    if series.size >= 30 and np.ptp(series) > 0:
        x = np.arange(series.size)
        detrended = series - np.polyval(np.polyfit(x, series, 1), x)
        detrended = detrended - detrended.mean()
        power = np.abs(np.fft.rfft(detrended, 2 * series.size)) ** 2
        acf = np.fft.irfft(power)[: series.size]
        if acf[0] > 0:
            acf = acf / acf[0] * series.size / (series.size - np.arange(series.size))
            longest = series.size // 3
            peaks = [
                lag
                for lag in range(2, longest)
                if acf[lag] >= SEASON_STRENGTH and acf[lag - 1] <= acf[lag] > acf[lag + 1]
            ]
            # A peak counts only if the correlation dipped well below it before (the slow decay
            # of a wandering level is not a season).
            peaks = [lag for lag in peaks if acf[1:lag].min() < acf[lag] - 0.2]
            if peaks:
                found.add(max(peaks, key=lambda lag: acf[lag]))
    return sorted(found)


@dataclass(frozen=True)
class LearnedModel:
    """A stream's learned model and detectors, with how they were obtained."""

    fits: list[ChannelFit]
    monitor: MonitorConfig
    scales: list[ChannelScale]
    sample_period_s: float
    readings: int
    false_alarms_per_day: float
    seasons: list[int] = field(default_factory=list)
    network: Forecaster | None = None
    """The stateful LSTM, when it was chosen over the linear models (`fits`)."""
    network_rmse: float = math.nan
    network_note: str = ""
    """What became of the LSTM candidate (app/learning/network.py)."""

    @property
    def kinds(self) -> list[str]:
        """Each channel's model kind."""
        kinds: list[str] = [fit.kind for fit in self.fits]
        if self.network is not None:
            kinds[0] = self.network.kind
        return kinds

    @cached_property
    def forecaster(self) -> Forecaster:
        return self.network if self.network is not None else LaggedLinear(self.fits)

    def recurrence(self, *, max_gap: int = DEFAULT_MAX_GAP) -> Recurrence:
        return Recurrence(self.forecaster, self.monitor, max_gap=max_gap)

    def forecast(self, readings: Readings) -> StreamResult:
        """Its forecaster over one stream's readings from a fresh state, with no detector but
        the missing-readings rule: the residuals its thresholds are fitted on."""
        placeholder = MonitorConfig(channels=readings.values.shape[1], detectors=[MissingConfig()])
        recurrence = Recurrence(self.forecaster, placeholder)
        state = recurrence.new_state()
        return recurrence.advance([state], readings, [self.sample_period_s]).stream(0)

    def summary(self, channels: list[str]) -> dict[str, Any]:
        """Per channel: the model chosen, its hold-out error beside the naive forecast's, the
        residual scale. What `GET /v1/streams/{id}` shows."""
        summary = {
            name: {
                "kind": kind,
                "period": fit.period,
                "validation_rmse": _number(fit.validation_rmse),
                "naive_rmse": _number(fit.naive_rmse),
                "residual_scale": scale.scale,
                "constant": scale.resolution == 0,
            }
            for name, kind, fit, scale in zip(
                channels, self.kinds, self.fits, self.scales, strict=True
            )
        }
        if self.network is not None:
            summary[channels[0]].update(
                period=None,
                validation_rmse=_number(self.network_rmse),
                linear=self.fits[0].kind,
                linear_rmse=_number(self.fits[0].validation_rmse),
            )
        return summary

    def to_json(self) -> dict[str, Any]:
        return {
            "version": LEARNED_VERSION,
            "fits": [fit.as_json() for fit in self.fits],
            "monitor": self.monitor.model_dump(mode="json"),
            "scales": [[s.scale, s.resolution] for s in self.scales],
            "sample_period_s": self.sample_period_s,
            "readings": self.readings,
            "false_alarms_per_day": self.false_alarms_per_day,
            "seasons": self.seasons,
            "network": None if self.network is None else pack_forecaster(self.network),
            "network_rmse": _number(self.network_rmse),
            "network_note": self.network_note,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LearnedModel:
        if raw.get("version") != LEARNED_VERSION:
            raise DataError(f"learned model version {raw.get('version')!r} is not supported")
        return cls(
            fits=[ChannelFit.from_json(fit) for fit in raw["fits"]],
            monitor=MonitorConfig.model_validate(raw["monitor"]),
            scales=[ChannelScale(float(a), float(b)) for a, b in raw["scales"]],
            sample_period_s=float(raw["sample_period_s"]),
            readings=int(raw["readings"]),
            false_alarms_per_day=float(raw["false_alarms_per_day"]),
            seasons=[int(x) for x in raw.get("seasons", [])],
            network=None if raw.get("network") is None else unpack_forecaster(raw["network"]),
            network_rmse=math.nan if raw.get("network_rmse") is None else raw["network_rmse"],
            network_note=str(raw.get("network_note", "")),
        )


def _number(x: float) -> float | None:
    return None if x != x else x


def learn(
    times: np.ndarray,
    values: np.ndarray,
    *,
    sample_period_s: float | None = None,
    false_alarms_per_day: float = 1.0,
    max_gap: int = DEFAULT_MAX_GAP,
    references: np.ndarray | None = None,
    lstm: bool = False,
    normal: np.ndarray | None = None,
) -> LearnedModel:
    """Learn a stream from its readings: times (R,) int64 microseconds, values (R, C), NaN for
    a missing number, and a reference sensor's readings of channel 0 (R,) if it has one.
    `lstm`: offer the stateful LSTM among the candidates where it may be (app/learning/
    network.py). `normal` (R,): the readings that may teach it (by default all); the others
    (a relearning's readings under alarms) only carry the recurrence through. DataError if
    they cannot teach anything."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        values = values[:, None]
    count, channels = values.shape
    if count < MIN_READINGS:
        raise DataError(f"learning needs at least {MIN_READINGS} readings, got {count}")
    if not false_alarms_per_day > 0:
        raise DataError("false_alarms_per_day must be positive")
    period = sample_period(times) if sample_period_s is None else float(sample_period_s)
    normal = np.ones(count, dtype=bool) if normal is None else np.asarray(normal, dtype=bool)
    teaching = np.where(normal[:, None], values, np.nan)
    for c in range(channels):
        if np.isnan(teaching[:, c]).all():
            raise DataError(f"channel {c} has no number among the learning readings")
    seasons = sorted({p for c in range(channels) for p in seasonal_periods(teaching[:, c], period)})
    chosen = [fit_channel(teaching[:, c], seasons) for c in range(channels)]
    fits = [fit for fit, _ in chosen]
    readings = Readings.of_one(np.asarray(times, dtype=np.int64), values, references)
    placeholder = MonitorConfig(channels=channels, detectors=[MissingConfig()])

    def through(forecaster: Forecaster) -> StreamResult:
        recurrence = Recurrence(forecaster, placeholder, max_gap=max_gap)
        return recurrence.advance([recurrence.new_state()], readings, [period]).stream(0)

    unseen = [residuals for _, residuals in chosen]
    candidate = _network_candidate(values, normal, through, linear_unseen=unseen[0], wanted=lstm)
    result = through(candidate.network or LaggedLinear(fits))
    watched = result.monitored & normal
    if candidate.network is not None:
        unseen = [np.where(normal, result.residuals[:, 0], np.nan)[holdout_split(count) :]]
    residuals = np.where(watched[:, None], result.residuals, np.nan)
    missing = np.where(normal, np.isnan(values).any(axis=1), np.nan)
    gaps = None if references is None else np.where(normal, result.reference_gap, np.nan)
    monitor, scales = detectors_for(
        residuals,
        values,
        [fit.offset for fit in fits],
        missing=missing,
        sample_period_s=period,
        false_alarms_per_day=false_alarms_per_day,
        reference_gaps=gaps,
        unseen=unseen,
    )
    return LearnedModel(
        fits=fits,
        monitor=monitor,
        scales=scales,
        sample_period_s=period,
        readings=count,
        false_alarms_per_day=false_alarms_per_day,
        seasons=seasons,
        network=candidate.network,
        network_rmse=candidate.validation_rmse,
        network_note=candidate.note,
    )


def _network_candidate(
    values: np.ndarray,
    normal: np.ndarray,
    through: Callable[[Forecaster], StreamResult],
    *,
    linear_unseen: np.ndarray,
    wanted: bool,
) -> NetworkCandidate:
    """The LSTM candidate trained and judged against the linear model on the held-out tail
    (both forecasts' residuals there from models that never saw it)."""
    count, channels = values.shape
    why_not = not_tried(count, channels, wanted=wanted)
    if why_not is not None:
        return NetworkCandidate(None, math.nan, why_not)
    split = holdout_split(count)
    try:
        network = train_network(values[:split][normal[:split]])
    except AppError as exc:
        return failed(exc)
    held = np.where(normal, through(network).residuals[:, 0], np.nan)[split:]
    return judge(network, float(np.nanmean(held**2)), float(np.nanmean(linear_unseen**2)))
