"""The monitor: a configuration's detectors and alarm rules, run over blocks of residuals.

    config = MonitorConfig.from_manifest(manifest)      # thresholds written by calibrate
    monitor = Monitor(config)                           # shared by every stream configured alike
    state = monitor.new_state()                         # one per stream
    block = monitor.advance([state], residuals, gaps, first_samples=[0])
    block.statistics, block.opened, block.closed        # per-detector values, transitions
    saved = monitor.state_to_json(state)                # resume with monitor.state_from_json

A block is the residuals of many streams over many readings, `(N, T)` (`(N, T, C)` for a sensor
group), with the gaps between readings and their reference sensors beside them. Whatever the
grouping of streams and readings into blocks, every stream gets the same statistics, bit for
bit, the same events and the same state: the live service, a replay after a crash and the
offline evaluation all run this one function.

NaN means no input: the stream's detectors skip the reading, their state holds, the reading has
no statistic and cannot alarm. An infinite residual or gap is refused with a DataError before
anything changes: it would poison every running statistic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.errors import ArtifactError, DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule, RuleState
from app.monitoring.detectors import (
    CusumDetector,
    Detector,
    FloatArray,
    LevelDetector,
    MahalanobisDetector,
    PointDetector,
    RollingRMSDetector,
    VarianceFloorDetector,
)

STATE_VERSION = 2
DETECTOR_ORDER = ("point", "rolling_rms", "variance_floor", "cusum", "level", "mahalanobis")


# --- configuration (what a manifest stores) ------------------------------------------------------


class _DetectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(allow_inf_nan=False)
    alarm: AlarmPolicy | None = None  # overrides the monitor's default policy


class PointConfig(_DetectorConfig):
    kind: Literal["point"] = "point"


class RollingRMSConfig(_DetectorConfig):
    kind: Literal["rolling_rms"] = "rolling_rms"
    window: int = Field(default=50, ge=2)


class VarianceFloorConfig(_DetectorConfig):
    kind: Literal["variance_floor"] = "variance_floor"
    window: int = Field(default=20, ge=2)


class CusumConfig(_DetectorConfig):
    kind: Literal["cusum"] = "cusum"
    sigma: float = Field(gt=0, allow_inf_nan=False)
    kappa: float = Field(gt=0, allow_inf_nan=False)
    clip: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class LevelConfig(_DetectorConfig):
    kind: Literal["level"] = "level"
    window: int = Field(default=10, ge=2)


class MahalanobisConfig(_DetectorConfig):
    kind: Literal["mahalanobis"] = "mahalanobis"
    covariance: list[list[float]]


DetectorConfig = Annotated[
    PointConfig
    | RollingRMSConfig
    | VarianceFloorConfig
    | CusumConfig
    | LevelConfig
    | MahalanobisConfig,
    Field(discriminator="kind"),
]


class MonitorConfig(BaseModel):
    """Detectors and alarm rules of a stream; stored as the `thresholds` field of a manifest.

    `calibration` records how the thresholds were obtained (margins or target rate, hold-out,
    what rate the hold-out supports); the monitor itself does not read it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    channels: int = Field(default=1, ge=1)
    alarm: AlarmPolicy = AlarmPolicy()
    detectors: list[DetectorConfig]
    calibration: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> MonitorConfig:
        kinds = [d.kind for d in self.detectors]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each detector kind at most once, got {kinds}")
        for d in self.detectors:
            if isinstance(d, MahalanobisConfig) and len(d.covariance) != self.channels:
                raise ValueError(
                    f"mahalanobis covariance is {len(d.covariance)}x.. for {self.channels} channels"
                )
        return self

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> MonitorConfig:
        """The thresholds `twinwatch calibrate` stored in a model manifest."""
        raw = manifest.get("thresholds")
        if raw is None:
            raise ArtifactError(
                "the model has no detector thresholds: run `twinwatch calibrate` on it first"
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ArtifactError(f"the model's thresholds are invalid: {_summary(exc)}") from None

    def thresholds(self) -> dict[str, float]:
        return {d.kind: d.threshold for d in self.detectors}

    def detector(self, kind: str) -> DetectorConfig | None:
        return next((d for d in self.detectors if d.kind == kind), None)


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'thresholds'}: {e['msg']}" for e in exc.errors()
    )


def build_detector(config: DetectorConfig) -> Detector:
    """A detector from its configuration."""
    threshold = config.threshold
    if isinstance(config, PointConfig):
        return PointDetector(threshold=threshold)
    if isinstance(config, RollingRMSConfig):
        return RollingRMSDetector(threshold=threshold, window=config.window)
    if isinstance(config, VarianceFloorConfig):
        return VarianceFloorDetector(threshold=threshold, window=config.window)
    if isinstance(config, CusumConfig):
        return CusumDetector(
            threshold=threshold, sigma=config.sigma, kappa=config.kappa, clip=config.clip
        )
    if isinstance(config, LevelConfig):
        return LevelDetector(threshold=threshold, window=config.window)
    return MahalanobisDetector(threshold=threshold, covariance=config.covariance)


# --- state and results --------------------------------------------------------------------------


@dataclass
class MonitorState:
    """One stream's monitor: every detector's floats side by side, and each rule's state."""

    values: FloatArray  # (Monitor.state_size,)
    rules: list[RuleState]  # in the monitor's detector order
    busy: bool = False  # some rule is not idle (an event open, or recent exceedances)


@dataclass(frozen=True)
class MonitorBlock:
    """What a block did: each detector's statistics ((N, T), NaN where none) and, by row (the
    streams that had any), the events opened and closed, in sample order."""

    statistics: dict[str, FloatArray]
    opened: dict[int, list[AlarmEvent]] = field(default_factory=dict)
    closed: dict[int, list[AlarmEvent]] = field(default_factory=dict)


# --- the monitor --------------------------------------------------------------------------------


class Monitor:
    """The configured detectors with their alarm rules, in `DETECTOR_ORDER`."""

    def __init__(self, config: MonitorConfig) -> None:
        self.config = config
        ordered = sorted(config.detectors, key=lambda d: DETECTOR_ORDER.index(d.kind))
        self.detectors = [build_detector(d) for d in ordered]
        self.kinds = [d.kind for d in ordered]
        self.kinds_tuple = tuple(self.kinds)
        self.rules = [
            AlarmRule(
                detector.kind,
                settings.alarm or config.alarm,
                threshold=detector.threshold,
                direction=detector.direction,
            )
            for detector, settings in zip(self.detectors, ordered, strict=True)
        ]
        self.slices: list[slice] = []
        offset = 0
        for detector in self.detectors:
            self.slices.append(slice(offset, offset + detector.state_size))
            offset += detector.state_size
        self.state_size = offset
        self._initial = np.concatenate([np.empty(0), *(d.initial_state() for d in self.detectors)])

    @property
    def thresholds(self) -> dict[str, float]:
        return {d.kind: d.threshold for d in self.detectors}

    def new_state(self) -> MonitorState:
        return MonitorState(self._initial.copy(), [RuleState() for _ in self.rules])

    def advance(
        self,
        states: Sequence[MonitorState],
        residuals: FloatArray,
        reference_gaps: FloatArray | None = None,
        *,
        first_samples: Sequence[int],
    ) -> MonitorBlock:
        """Advance each stream's state (row i of the block is `states[i]`, its reading t the
        stream's sample `first_samples[i] + t`) and say what happened."""
        matrix = np.asarray(residuals, dtype=np.float64)
        if matrix.ndim == 2:
            matrix = matrix[:, :, None]
        count = len(states)
        if matrix.ndim != 3 or matrix.shape[0] != count or matrix.shape[2] != self.config.channels:
            raise DataError(
                f"residuals of shape {np.shape(residuals)} for {count} stream(s): the monitor "
                f"watches {self.config.channels} channel(s)"
            )
        steps = matrix.shape[1]
        gaps = None
        if reference_gaps is not None:
            gaps = np.asarray(reference_gaps, dtype=np.float64)
            if gaps.shape != (count, steps):
                raise DataError(
                    f"reference gaps of shape {gaps.shape} for residuals {matrix.shape}"
                )
        for name, values in (("residual", matrix), ("reference gap", gaps)):
            if values is not None and np.isinf(values).any():
                row, t = (int(i) for i in np.argwhere(np.isinf(values))[0][:2])
                raise DataError(f"sample {first_samples[row] + t}: the {name} is infinite")
        if not count:
            return MonitorBlock({kind: np.empty((0, steps)) for kind in self.kinds})
        stacked = np.array([state.values for state in states])
        after = stacked.copy()
        busy = [row for row, state in enumerate(states) if state.busy]
        block = MonitorBlock({})
        touched: set[int] = set()
        for index, (detector, rule, part) in enumerate(
            zip(self.detectors, self.rules, self.slices, strict=True)
        ):
            if detector.source == "reference_gap":
                if gaps is None:  # no reference: no statistic, the state holds
                    block.statistics[detector.kind] = np.full((count, steps), np.nan)
                    continue
                inputs = gaps
            elif detector.source == "vector":
                inputs = matrix
            else:
                inputs = matrix[:, :, 0]
            statistics, after[:, part] = detector.statistics(inputs, stacked[:, part])
            block.statistics[detector.kind] = statistics
            exceeded = detector.exceeds(statistics)
            if not (busy or exceeded.any()):
                continue
            rows = sorted(set(np.flatnonzero(exceeded.any(axis=1)).tolist()).union(busy))
            touched.update(rows)
            for row in rows:
                values, over, first = (
                    statistics[row].tolist(),
                    exceeded[row].tolist(),
                    first_samples[row],
                )
                has = [t for t, value in enumerate(values) if value == value]  # not NaN
                opened, closed = rule.observe(
                    states[row].rules[index],
                    [first + t for t in has],
                    [values[t] for t in has],
                    [position for position, t in enumerate(has) if over[t]],
                )
                if opened:
                    block.opened.setdefault(row, []).extend(opened)
                if closed:
                    block.closed.setdefault(row, []).extend(closed)
        for row, state in enumerate(states):
            state.values = after[row].copy()  # (a view would keep the whole block alive)
        for row in touched:
            states[row].busy = not all(rule.idle for rule in states[row].rules)
        order = {kind: i for i, kind in enumerate(DETECTOR_ORDER)}
        for events in block.opened.values():
            events.sort(key=lambda e: (e.start, order[e.detector]))
        for events in block.closed.values():
            events.sort(key=lambda e: (e.cleared_at or 0, order[e.detector]))
        return block

    # -- state --

    def open_events(self, state: MonitorState) -> list[AlarmEvent]:
        """Events still open, with their peak so far."""
        if not state.busy:  # every rule idle: nothing open
            return []
        return [
            event
            for rule, rule_state in zip(self.rules, state.rules, strict=True)
            if (event := rule.current(rule_state)) is not None
        ]

    def state_to_json(self, state: MonitorState) -> dict[str, Any]:
        """JSON-ready (finite floats, None for a detector's not-yet-filled slots)."""
        return {
            "version": STATE_VERSION,
            "values": [None if math.isnan(x) else x for x in state.values.tolist()],
            "rules": {
                kind: rule_state.to_json()
                for kind, rule_state in zip(self.kinds, state.rules, strict=True)
            },
        }

    def state_from_json(self, saved: Mapping[str, Any]) -> MonitorState:
        """Resume a stream: the continuation is identical to never having stopped. A state of
        another configuration (other detectors, other windows) is refused with a DataError."""
        if saved.get("version") == 1:
            saved = self._upgrade(saved)
        if saved.get("version") != STATE_VERSION:
            raise DataError(f"monitor state version {saved.get('version')!r} is not supported")
        raw_values, raw_rules = saved.get("values"), saved.get("rules")
        if not isinstance(raw_values, list) or not isinstance(raw_rules, dict):
            raise DataError("monitor state needs 'values' and 'rules'")
        if set(raw_rules) != set(self.kinds) or len(raw_values) != self.state_size:
            raise DataError(
                f"monitor state is for detectors {sorted(raw_rules)}, "
                f"the configuration has {sorted(self.kinds)}"
            )
        try:
            values = np.array(
                [math.nan if x is None else float(x) for x in raw_values], dtype=np.float64
            )
        except (TypeError, ValueError):
            raise DataError("monitor state values must be numbers or null") from None
        for detector, part in zip(self.detectors, self.slices, strict=True):
            problem = detector.check_state(values[part])
            if problem is not None:
                raise DataError(f"monitor state: {problem}")
        rules = [
            RuleState.from_json(raw_rules[rule.detector], rule.policy, rule.detector)
            for rule in self.rules
        ]
        return MonitorState(values, rules, busy=not all(r.idle for r in rules))

    def _upgrade(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """A state written by twinwatch 0.1 (per-detector buffers of up to `window` inputs)."""
        detectors = saved.get("detectors")
        if not isinstance(detectors, dict) or set(detectors) != set(self.kinds):
            raise DataError("monitor state (version 1) is for another configuration")
        values: list[float | None] = []
        for detector in self.detectors:
            old = detectors[detector.kind]
            if isinstance(detector, CusumDetector):
                values.append(old.get("s"))
            elif detector.state_size:
                kept = list(old.get("buffer", []))[-detector.state_size :]
                values += [None] * (detector.state_size - len(kept)) + kept
        return {"version": STATE_VERSION, "values": values, "rules": saved.get("alarms")}


def reference_gap(value: FloatArray, reference: FloatArray) -> FloatArray:
    """What the level detector watches: the reading minus the reference sent with it."""
    return value - reference
