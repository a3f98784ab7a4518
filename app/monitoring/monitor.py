"""The monitor of one stream: configured detectors, their thresholds and alarm rules, and state.

    config = MonitorConfig.from_manifest(loaded.manifest)   # thresholds written by calibrate
    monitor = Monitor(config)                               # one per stream
    step = monitor.update(residual, reference_gap=reference_gap(value, reference))  # or None
    step.statistics, step.opened, step.closed               # per-detector values, transitions
    saved = monitor.state_dict()            # JSON; resume with Monitor.from_state(config, saved)
    run = monitor.run(residuals, reference_gaps)            # batch: same numbers, same events

`update` and `run` advance the same state: a stream may be replayed in batch and continued one
reading at a time, and gives the same statistics (bit for bit) and the same events either way.

Inputs. The residual is a float (one channel) or a vector (a sensor group; the scalar detectors
watch channel 0, `mahalanobis` the whole vector). NaN means a missing reading: detectors skip the
sample, their state holds, the sample has no statistic (None / NaN) and cannot alarm. An
infinite residual or gap is refused with a DataError: it would poison every running statistic.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.errors import ArtifactError, DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule
from app.monitoring.detectors import (
    CusumDetector,
    Detector,
    F,
    FloatArray,
    LevelDetector,
    MahalanobisDetector,
    PointDetector,
    RollingRMSDetector,
    VarianceFloorDetector,
)

STATE_VERSION = 1
DETECTOR_ORDER = ("point", "rolling_rms", "variance_floor", "cusum", "level", "mahalanobis")
FEW_MONITORS = 24
"""Below this many monitors `Monitor.update_many` steps them one by one (cheaper than numpy)."""


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
    """A fresh detector from its configuration."""
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


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorStep:
    """What one reading did: each detector's statistic (None if it has none) and transitions."""

    sample: int
    statistics: dict[str, float | None]
    exceeded: dict[str, bool]
    opened: list[AlarmEvent]
    closed: list[AlarmEvent]


@dataclass(frozen=True)
class MonitorSteps:
    """`Monitor.update_many`'s results as columns over the monitors (row i: monitor i):
    statistics NaN where `update` gives None; transitions only for the rows that had one, and
    the rows left with an open event (they alone need `open_events`)."""

    samples: list[int]
    statistics: dict[str, FloatArray]
    exceeded: dict[str, NDArray[np.bool_]]
    opened: dict[int, list[AlarmEvent]]
    closed: dict[int, list[AlarmEvent]]
    still_open: set[int]

    @classmethod
    def of(cls, steps: Sequence[MonitorStep], monitors: Sequence[Monitor]) -> MonitorSteps:
        kinds = list(steps[0].statistics) if steps else []
        return cls(
            samples=[step.sample for step in steps],
            statistics={
                kind: np.array(
                    [math.nan if (x := step.statistics[kind]) is None else x for step in steps],
                    dtype=np.float64,
                )
                for kind in kinds
            },
            exceeded={kind: np.array([step.exceeded[kind] for step in steps]) for kind in kinds},
            opened={row: step.opened for row, step in enumerate(steps) if step.opened},
            closed={row: step.closed for row, step in enumerate(steps) if step.closed},
            still_open={
                row
                for row, monitor in enumerate(monitors)
                if any(rule.is_open for rule in monitor.rules.values())
            },
        )

    def __len__(self) -> int:
        return len(self.samples)

    def step(self, row: int) -> MonitorStep:
        """Row `row` as `update` gives it."""
        return MonitorStep(
            self.samples[row],
            {
                kind: None if math.isnan(x := float(column[row])) else x
                for kind, column in self.statistics.items()
            },
            {kind: bool(column[row]) for kind, column in self.exceeded.items()},
            list(self.opened.get(row, [])),
            list(self.closed.get(row, [])),
        )

    def __iter__(self) -> Iterator[MonitorStep]:
        return (self.step(row) for row in range(len(self)))


@dataclass(frozen=True)
class MonitorRun:
    """A batch: per-detector statistic (NaN = none) and exceedance arrays, and the transitions."""

    first_sample: int
    statistics: dict[str, FloatArray]
    exceeded: dict[str, NDArray[np.bool_]]
    opened: list[AlarmEvent]
    closed: list[AlarmEvent]

    def events(self, still_open: Sequence[AlarmEvent] = ()) -> list[AlarmEvent]:
        """Events that ended in this run plus `still_open`, ordered by start then detector."""
        order = {kind: i for i, kind in enumerate(DETECTOR_ORDER)}
        return sorted([*self.closed, *still_open], key=lambda e: (e.start, order[e.detector]))


# --- the monitor --------------------------------------------------------------------------------


class Monitor:
    """The configured detectors of one stream with their alarm rules and running state."""

    def __init__(self, config: MonitorConfig) -> None:
        self.config = config
        ordered = sorted(config.detectors, key=lambda d: DETECTOR_ORDER.index(d.kind))
        self.detectors: dict[str, Detector] = {d.kind: build_detector(d) for d in ordered}
        self.rules: dict[str, AlarmRule] = {
            d.kind: AlarmRule(
                d.kind,
                d.alarm or config.alarm,
                threshold=d.threshold,
                direction=self.detectors[d.kind].direction,
            )
            for d in ordered
        }
        self._sample = 0
        # The same, as tuples in the detectors' order: `update_many` transposes a tick's
        # monitors into one tuple per kind with a single zip.
        self._detector_tuple = tuple(self.detectors.values())
        self._rule_tuple = tuple(self.rules.values())

    @property
    def sample(self) -> int:
        """Index of the next sample (the number of samples seen)."""
        return self._sample

    # -- incremental --

    def update(
        self, residual: float | Sequence[float], *, reference_gap: float | None = None
    ) -> MonitorStep:
        """Advance by one reading (residual: value - forecast; reference_gap: value - reference)."""
        vector = self._vector(residual)
        gap = None if reference_gap is None else float(reference_gap)
        if gap is not None and math.isinf(gap):
            raise DataError(f"sample {self._sample}: the reference gap is infinite")
        sample = self._sample
        statistics: dict[str, float | None] = {}
        exceeded: dict[str, bool] = {}
        opened: list[AlarmEvent] = []
        closed: list[AlarmEvent] = []
        for kind, detector in self.detectors.items():
            value: Any
            if detector.source == "reference_gap":
                value = gap if gap is not None and not math.isnan(gap) else None
            elif detector.source == "vector":
                value = vector if not any(math.isnan(x) for x in vector) else None
            else:
                value = vector[0] if not math.isnan(vector[0]) else None
            statistic = None if value is None else detector.update(value)
            statistics[kind] = statistic
            exceeded[kind] = statistic is not None and bool(detector.exceeds(statistic))
            if statistic is not None:
                event_opened, event_closed = self.rules[kind].observe(
                    sample, statistic, exceeded[kind]
                )
                if event_opened is not None:
                    opened.append(event_opened)
                if event_closed is not None:
                    closed.append(event_closed)
        self._sample += 1
        return MonitorStep(sample, statistics, exceeded, opened, closed)

    @staticmethod
    def update_many(
        monitors: Sequence[Monitor],
        residuals: NDArray[np.float64],
        reference_gaps: NDArray[np.float64] | None = None,
    ) -> MonitorSteps:
        """`update` on many monitors of one configuration (one per stream), one reading each:
        row i of `residuals` ((N, C), NaN: none) and of `reference_gaps` ((N,), NaN: none) for
        monitor i. Each detector kind is stepped for all the streams at once and the results
        come back as columns; every stream gets the statistics and transitions `update` would
        give it. Nothing changes on bad input. Fewer than `FEW_MONITORS` are stepped one by
        one: numpy's per-call overhead would cost more than it saves (one monitor: 17 us
        alone, 170 us through numpy)."""
        if not monitors:
            return MonitorSteps([], {}, {}, {}, {}, set())
        config = monitors[0].config
        matrix = np.asarray(residuals, dtype=np.float64)
        if matrix.ndim == 1:
            matrix = matrix[:, None]
        count = len(monitors)
        shared = all(m.config is config or m.config == config for m in monitors)
        if matrix.shape != (count, config.channels) or not shared:
            raise ValueError("update_many takes one residual row per monitor of one configuration")
        gaps = (
            np.full(count, np.nan)
            if reference_gaps is None
            else np.asarray(reference_gaps, dtype=np.float64)
        )
        infinite = (("residual", np.isinf(matrix).any(axis=1)), ("reference gap", np.isinf(gaps)))
        for name, bad in infinite:
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise DataError(f"sample {monitors[row]._sample}: the {name} is infinite")
        if count < FEW_MONITORS:
            row_list, gap_list = matrix.tolist(), gaps.tolist()
            return MonitorSteps.of(
                [
                    monitor.update(row_list[index], reference_gap=gap_list[index])
                    for index, monitor in enumerate(monitors)
                ],
                monitors,
            )
        samples = [monitor._sample for monitor in monitors]
        statistics: dict[str, FloatArray] = {}
        exceeded: dict[str, NDArray[np.bool_]] = {}
        opened: dict[int, list[AlarmEvent]] = {}
        closed: dict[int, list[AlarmEvent]] = {}
        still_open: set[int] = set()
        detectors_by_kind = zip(*(monitor._detector_tuple for monitor in monitors), strict=True)
        rules_by_kind = zip(*(monitor._rule_tuple for monitor in monitors), strict=True)
        detectors: Sequence[Detector]
        rules: Sequence[AlarmRule]
        for (kind, first), detectors, rules in zip(
            monitors[0].detectors.items(), detectors_by_kind, rules_by_kind, strict=True
        ):
            inputs, valid = _inputs(first, matrix, gaps)
            statistic = np.full(count, np.nan)
            over = np.zeros(count, dtype=bool)
            statistics[kind], exceeded[kind] = statistic, over
            rows: Sequence[int]
            if valid.all():
                rows = range(count)
            else:  # rows without an input: their rule holds, open or not
                rows = np.flatnonzero(valid).tolist()
                still_open.update(
                    row for row in np.flatnonzero(~valid).tolist() if rules[row].is_open
                )
                if not rows:
                    continue
                detectors, rules = [detectors[r] for r in rows], [rules[r] for r in rows]
                inputs = inputs[rows]
            values = type(first).update_many(detectors, inputs, alike=True)
            statistic[rows] = values
            over[:] = first.exceeds(statistic)
            AlarmRule.observe_many(
                rules,
                rows,
                samples if len(rows) == count else [samples[row] for row in rows],
                values.tolist(),
                over[rows].tolist(),
                opened=opened,
                closed=closed,
                still_open=still_open,
            )
        for monitor in monitors:
            monitor._sample += 1
        return MonitorSteps(samples, statistics, exceeded, opened, closed, still_open)

    def _vector(self, residual: float | Sequence[float]) -> list[float]:
        if isinstance(residual, int | float):
            vector = [float(residual)]
        else:
            vector = [float(x) for x in residual]
        if len(vector) != self.config.channels:
            raise DataError(
                f"sample {self._sample}: {len(vector)} residual channel(s), "
                f"the monitor watches {self.config.channels}"
            )
        if any(math.isinf(x) for x in vector):
            raise DataError(f"sample {self._sample}: the residual is infinite")
        return vector

    # -- batch --

    def run(
        self, residuals: NDArray[np.float64], reference_gaps: NDArray[np.float64] | None = None
    ) -> MonitorRun:
        """Advance by a whole record, exactly as `update` on each of its samples would."""
        matrix = np.asarray(residuals, dtype=np.float64)
        if matrix.ndim == 1:
            matrix = matrix[:, None]
        if matrix.ndim != 2 or matrix.shape[1] != self.config.channels:
            raise DataError(
                f"residuals of shape {np.shape(residuals)}: the monitor watches "
                f"{self.config.channels} channel(s)"
            )
        count = matrix.shape[0]
        _refuse_infinite(matrix, "residual", self._sample)
        gaps = None
        if reference_gaps is not None:
            gaps = np.asarray(reference_gaps, dtype=np.float64)
            if gaps.shape != (count,):
                raise DataError(f"reference gaps of shape {gaps.shape} for {count} residuals")
            _refuse_infinite(gaps, "reference gap", self._sample)
        samples = np.arange(self._sample, self._sample + count, dtype=np.int64)
        statistics: dict[str, FloatArray] = {}
        exceeded: dict[str, NDArray[np.bool_]] = {}
        opened: list[AlarmEvent] = []
        closed: list[AlarmEvent] = []
        for kind, detector in self.detectors.items():
            inputs, valid = _inputs(
                detector, matrix, gaps if gaps is not None else np.full(count, np.nan)
            )
            statistic = np.full(count, np.nan)
            statistic[valid] = detector.batch(np.ascontiguousarray(inputs[valid]))
            has = ~np.isnan(statistic)
            over = np.zeros(count, dtype=bool)
            over[has] = detector.exceeds(statistic[has])
            statistics[kind] = statistic
            exceeded[kind] = over
            event_opened, event_closed = self.rules[kind].run(
                samples[has], statistic[has], over[has]
            )
            opened.extend(event_opened)
            closed.extend(event_closed)
        self._sample += count
        order = {kind: i for i, kind in enumerate(DETECTOR_ORDER)}
        opened.sort(key=lambda e: (e.start, order[e.detector]))
        closed.sort(key=lambda e: (e.cleared_at or 0, order[e.detector]))
        return MonitorRun(
            samples[0] if count else self._sample, statistics, exceeded, opened, closed
        )

    # -- state --

    def open_events(self) -> list[AlarmEvent]:
        """Events still open, with their peak so far."""
        return [e for rule in self.rules.values() if rule.is_open and (e := rule.current())]

    def open_peaks(self) -> dict[str, float]:
        """The peak so far of each open event, by detector."""
        return {
            kind: event.peak
            for kind, rule in self.rules.items()
            if rule.is_open and (event := rule.current())
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (finite floats, ints, lists): checkpoint it, restore with from_state."""
        return {
            "version": STATE_VERSION,
            "sample": self._sample,
            "detectors": {k: d.state_dict() for k, d in self.detectors.items()},
            "alarms": {k: r.state_dict() for k, r in self.rules.items()},
        }

    @classmethod
    def from_state(cls, config: MonitorConfig, state: Mapping[str, Any]) -> Monitor:
        """Resume a stream: the continuation is identical to never having stopped."""
        monitor = cls(config)
        if state.get("version") != STATE_VERSION:
            raise DataError(
                f"monitor state version {state.get('version')!r} is not {STATE_VERSION}"
            )
        detectors = state.get("detectors")
        alarms = state.get("alarms")
        sample = state.get("sample")
        if not isinstance(detectors, dict) or not isinstance(alarms, dict):
            raise DataError("monitor state needs 'detectors' and 'alarms' objects")
        if set(detectors) != set(monitor.detectors) or set(alarms) != set(monitor.rules):
            raise DataError(
                f"monitor state is for detectors {sorted(detectors)}, "
                f"the configuration has {sorted(monitor.detectors)}"
            )
        if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
            raise DataError("monitor state needs a non-negative integer 'sample'")
        for kind, detector in monitor.detectors.items():
            detector.load_state_dict(dict(detectors[kind]))
            monitor.rules[kind].load_state_dict(dict(alarms[kind]))
        monitor._sample = sample
        return monitor


def _inputs(
    detector: Detector, residuals: NDArray[np.float64], gaps: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """What the detector reads from each row ((N, C) residuals, (N,) reference gaps) and which
    rows have it (no NaN)."""
    if detector.source == "reference_gap":
        return gaps, ~np.isnan(gaps)
    if detector.source == "vector":
        return residuals, np.asarray(~np.isnan(residuals).any(axis=1))
    column = residuals[:, 0]
    return column, ~np.isnan(column)


def _refuse_infinite(values: NDArray[np.float64], what: str, offset: int) -> None:
    bad = np.isinf(values)
    if bad.any():
        index = int(np.argwhere(bad)[0][0])
        raise DataError(f"sample {offset + index}: the {what} is infinite")


def reference_gap(value: F, reference: F) -> F:
    """What the level detector watches: the reading minus the reference sent with it (floats for
    one reading, arrays for a record)."""
    return value - reference
