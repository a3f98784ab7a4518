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
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.errors import DataError
from app.monitoring.alarms import AlarmEvent, AlarmRule, RuleState
from app.monitoring.config import (
    DETECTOR_ORDER,
    PER_CHANNEL,
    MonitorConfig,
    build_detector,
)
from app.monitoring.detectors import (
    CusumDetector,
    Detector,
    FloatArray,
    MahalanobisDetector,
)

STATE_VERSION = 2
LARGEST_STATISTIC = 1e300
HOLDING = frozenset({"point", "rolling_rms", "cusum", "level", "mahalanobis", "shift"})
"""Detectors whose open alarm says the readings are not what normal looks like: while one is
open, a stream that can (`Recurrence`) keeps its readings out of its model's history. Not the
variance floor (a frozen reading is a plausible value) nor missing readings (none to keep)."""


# --- state and results --------------------------------------------------------------------------


@dataclass(slots=True)
class MonitorState:
    """One stream's monitor: every detector's floats side by side, and each rule's state."""

    values: FloatArray  # (Monitor.state_size,)
    rules: list[RuleState]  # in the monitor's detector order
    busy: bool = False  # some rule is not idle (an event open, or recent exceedances)

    def copy(self) -> MonitorState:
        """An independent copy (`Monitor.advance` changes its rules' states in place; it
        replaces `values`)."""
        rules = (
            [rule.copy() for rule in self.rules] if self.busy else [RuleState() for _ in self.rules]
        )
        return MonitorState(self.values, rules, self.busy)


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
        channels = config.channels
        # Per detector: the gain of each channel it watches (None: it reads no residual
        # channel), and where its floats sit in a stream's state (one set per channel watched).
        self.gains: list[FloatArray | None] = [
            (np.asarray(settings.gains, dtype=np.float64) if settings.gains else np.ones(channels))
            if detector.kind in PER_CHANNEL
            else None
            for detector, settings in zip(self.detectors, ordered, strict=True)
        ]
        self.slices: list[slice] = []
        offset = 0
        initial: list[FloatArray] = []
        for detector, gains in zip(self.detectors, self.gains, strict=True):
            copies = 1 if gains is None else channels
            self.slices.append(slice(offset, offset + copies * detector.state_size))
            offset += copies * detector.state_size
            initial += [detector.initial_state()] * copies
        self.state_size = offset
        self._initial = np.concatenate([np.empty(0), *initial])

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
        missing: FloatArray | None = None,
        held_out: NDArray[np.bool_] | None = None,
        readings: FloatArray | None = None,
    ) -> MonitorBlock:
        """Advance each stream's state (row i of the block is `states[i]`, its reading t the
        stream's sample `first_samples[i] + t`) and say what happened. `missing`: 1 for a
        reading that came without a number, 0 for a complete one, NaN for no reading.
        `held_out` (N, C): the channels whose readings the stream keeps out of its model's
        history throughout the block (`Recurrence.advance`): their residuals are forecasts
        several readings ahead, whose spread says nothing of a frozen sensor: the variance
        floor skips them. `readings` (N, T, C): the readings themselves where the residuals
        are watched (NaN elsewhere), for a detector that reads them (none given: the block's
        residuals stand in)."""
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
        absent = None
        if missing is not None:
            absent = np.asarray(missing, dtype=np.float64)
            if absent.shape != (count, steps):
                raise DataError(
                    f"missing flags of shape {absent.shape} for residuals {matrix.shape}"
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
            per_channel = None
            if detector.source == "reference_gap" or detector.source == "missing":
                inputs = gaps if detector.source == "reference_gap" else absent
                if inputs is None:  # no reference (no flags): no statistic, the state holds
                    block.statistics[detector.kind] = np.full((count, steps), np.nan)
                    continue
                statistics, after[:, part] = detector.statistics(inputs, stacked[:, part])
            elif detector.source == "vector":
                statistics, after[:, part] = detector.statistics(matrix, stacked[:, part])
            else:
                inputs = matrix
                if detector.source == "reading":
                    inputs = matrix if readings is None else np.asarray(readings, np.float64)
                elif held_out is not None and detector.direction == "below":
                    inputs = np.where(held_out[:, None, :], np.nan, matrix)
                statistics, per_channel, after[:, part] = self._per_channel(
                    detector, self.gains[index], inputs, stacked[:, part]
                )
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
                alarming = [position for position, t in enumerate(has) if over[t]]
                lingering: list[int] = []
                if rule.policy.clear < 1 and (states[row].rules[index].open or alarming):
                    near = self._lingering(detector, rule.policy.clear, statistics[row])
                    lingering = [p for p, t in enumerate(has) if near[t] and not over[t]]
                opened, closed = rule.observe(
                    states[row].rules[index],
                    [first + t for t in has],
                    [values[t] for t in has],
                    alarming,
                    self._details(detector, per_channel, matrix, row, [has[p] for p in alarming]),
                    lingering,
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

    @staticmethod
    def _per_channel(
        detector: Detector, gains: FloatArray | None, matrix: FloatArray, state: FloatArray
    ) -> tuple[FloatArray, FloatArray | None, FloatArray]:
        """A residual detector on each channel (N streams x C channels as N*C rows, each with
        its own floats), each statistic times its channel's gain, combined into the one
        farthest on the alarming side. Returns it, the gained statistics per channel (None for
        one channel) and the new state."""
        count, steps, channels = matrix.shape
        if channels == 1 and (gains is None or gains[0] == 1.0):
            single, after = detector.statistics(matrix[:, :, 0], state)
            return single, None, after
        size = detector.state_size
        rows = np.ascontiguousarray(matrix.transpose(0, 2, 1)).reshape(count * channels, steps)
        raw, after = detector.statistics(rows, state.reshape(count * channels, size))
        weights = np.ones(channels) if gains is None else gains
        watched = weights > 0
        # (A huge gain on a channel that never moved while learning must not make a statistic
        # infinite: it is stored, exported and compared.)
        per_channel = np.minimum(
            raw.reshape(count, channels, steps).transpose(0, 2, 1) * weights, LARGEST_STATISTIC
        )
        per_channel[:, :, ~watched] = np.nan
        combine = np.fmax if detector.direction == "above" else np.fmin
        statistics: FloatArray = combine.reduce(per_channel, axis=2)
        return statistics, (per_channel if channels > 1 else None), after.reshape(count, -1)

    @staticmethod
    def _lingering(detector: Detector, clear: float, statistics: FloatArray) -> list[bool]:
        """Which statistics are not yet back within `clear` of the way from where the statistic
        rests to its threshold (none, for a detector with no known resting value)."""
        rest = detector.resting
        if rest is None:
            return [False] * statistics.shape[0]
        near: list[bool] = (statistics > rest + clear * (detector.threshold - rest)).tolist()
        return near

    @staticmethod
    def _details(
        detector: Detector,
        per_channel: FloatArray | None,
        matrix: FloatArray,
        row: int,
        steps: Sequence[int],
    ) -> list[list[float]] | None:
        """Per channel, what each exceedance is made of (for the peak's detail): the channel's
        gained statistic (0 for a channel it does not watch), or its term of the Mahalanobis
        distance; None for one channel."""
        parts: list[list[float]] | None = None
        if per_channel is not None:
            parts = np.nan_to_num(per_channel[row, steps], nan=0.0).tolist()
        elif isinstance(detector, MahalanobisDetector) and steps:
            parts = detector.contributions(matrix[row, steps]).tolist()
        return parts

    # -- state --

    def quiet(self, state: MonitorState) -> None:
        """Forget every rule's exceedances and open events, keeping what the detectors
        remember: the readings seen so far are normal by decree (a learning period)."""
        state.rules = [RuleState() for _ in self.rules]
        state.busy = False

    def holding(self, state: MonitorState) -> bool:
        """Whether an alarm of a `HOLDING` detector is open."""
        return state.busy and any(
            rule_state.open is not None and kind in HOLDING
            for kind, rule_state in zip(self.kinds, state.rules, strict=True)
        )

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
        saved = self.upgraded(saved)
        raw_values, raw_rules = saved.get("values"), saved.get("rules")
        if not isinstance(raw_values, list) or not isinstance(raw_rules, dict):
            raise DataError("monitor state needs 'values' and 'rules'")
        try:
            values = np.array(
                [math.nan if x is None else float(x) for x in raw_values], dtype=np.float64
            )
        except (TypeError, ValueError):
            raise DataError("monitor state values must be numbers or null") from None
        rules = {kind: RuleState.parse(raw, kind) for kind, raw in raw_rules.items()}
        return self.state_from_parts(values, rules)

    def state_from_parts(self, values: FloatArray, rules: Mapping[str, RuleState]) -> MonitorState:
        """A stream's monitor from its detectors' floats and its rules' states, as saved;
        refused with a DataError unless they are this configuration's."""
        if set(rules) != set(self.kinds) or len(values) != self.state_size:
            raise DataError(
                f"monitor state is for detectors {sorted(rules)}, "
                f"the configuration has {sorted(self.kinds)}"
            )
        for detector, part in zip(self.detectors, self.slices, strict=True):
            size = detector.state_size
            for floats in values[part].reshape(-1, size) if size else []:
                problem = detector.check_state(floats)
                if problem is not None:
                    raise DataError(f"monitor state: {problem}")
        checked = [rules[rule.detector].checked(rule.policy, rule.detector) for rule in self.rules]
        return MonitorState(values, checked, busy=not all(r.idle for r in checked))

    def upgraded(self, saved: Mapping[str, Any]) -> Mapping[str, Any]:
        """A saved monitor state in this release's JSON form (`state_to_json`)."""
        if saved.get("version") == 1:
            saved = self._upgrade(saved)
        if saved.get("version") != STATE_VERSION:
            raise DataError(f"monitor state version {saved.get('version')!r} is not supported")
        return saved

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
