"""The stream recurrence: state_t = step(state_{t-1}, reading_t), for a block of readings of
many streams of one model at once.

For each reading: forecast it from what the stream has seen, compute the residual (reading minus
forecast), run the detectors and alarm rules on it, and remember the reading. Everything that
computes a residual or an alarm runs this one function: a gateway's tick (many streams, one
reading each), one stream's batch, the replay after a crash, `twinwatch calibrate`,
`twinwatch evaluate monitor` and the demo. A stream gets the same forecasts, residuals,
statistics, alarms and state bit for bit however its readings were grouped into blocks and
whichever other streams shared them (the forecasters and detectors are written so, and the tests
check it), so a replay after a crash is exact.

Missing readings and gaps follow one rule:

- A null reading (any channel missing) is imputed with its own forecast (other missing channels
  with their last reading), so the stream's history stays complete; it has no residual.
- A null while the stream is still warming up, more than `max_gap` nulls in a row, or a pause of
  more than `max_gap` sample periods since the previous reading restart the warm-up: no
  forecast is made from fabricated or stale data.
- The detectors see nothing until the stream is warm (`window` readings since its run
  started), and no residual of a reading whose window holds an imputed one: a gap never causes
  an alarm storm, and the monitor's input never depends on a guess.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.errors import DataError
from app.forecasting.base import Forecaster
from app.monitoring.config import MonitorConfig
from app.monitoring.monitor import HOLDING, Monitor
from app.streams.blocks import BlockResult, FloatArray, Readings, StreamState, sized
from app.streams.gaps import DROPPED, IMPUTED, REAL, Plan, plan_block, restarts
from app.streams.legacy import from_json
from app.streams.saved import MAGIC as SAVED_MAGIC
from app.streams.saved import SavedState

STATE_VERSION = 3
"""The checkpoints this release writes (`app/streams/saved.py`); it reads those of versions 1
and 2 (JSON: `app/streams/legacy.py`) too."""
READABLE_STATE_VERSIONS = (1, 2, 3)
DEFAULT_MAX_GAP = 10
"""Nulls in a row, and sample periods of silence, after which a stream warms up again."""


class Recurrence:
    """One model's recurrence with one monitor configuration, shared by every stream configured
    alike. Pure: it changes only the states it is handed."""

    def __init__(
        self,
        forecaster: Forecaster,
        monitor_config: MonitorConfig,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
    ) -> None:
        if monitor_config.channels != forecaster.targets:
            raise ValueError(
                f"the monitor watches {monitor_config.channels} residual channel(s), the model "
                f"forecasts {forecaster.targets}"
            )
        if max_gap < 1:
            raise ValueError("max_gap must be at least 1")
        self.forecaster = forecaster
        self.monitor = Monitor(monitor_config)
        self.max_gap = max_gap
        self.window = forecaster.window
        self.channels = forecaster.n_channels
        self.targets = forecaster.targets
        growth = forecaster.spread_growth(1)
        self._held_channels = (
            None if growth is None or np.isnan(growth).all() else ~np.isnan(growth)
        )

    @property
    def monitor_config(self) -> MonitorConfig:
        return self.monitor.config

    # -- states --

    def new_state(self) -> StreamState:
        forecaster = self.forecaster
        return StreamState(
            samples=0,
            last_time=None,
            run=0,
            since_imputed=self.window,
            missing_run=0,
            history=np.full((forecaster.context, self.channels), np.nan),
            carry=forecaster.initial_carry(1)[0],
            pending=np.full(forecaster.outputs, np.nan),
            monitor=self.monitor.new_state(),
            latest=np.full(self._latest_size, np.nan),
        )

    def quietly(self, readings: Readings, sample_period_s: float, *, start: int) -> StreamState:
        """A fresh state run silently through one stream's `readings` (its samples from
        `start`): what they show is normal by decree. How a model that takes over a stream
        (a switch, a shadow) is warmed up on the readings before."""
        state = self.new_state()
        state.samples = start
        if readings.times.shape[0]:
            self.advance([state], readings, [sample_period_s])
            self.monitor.quiet(state.monitor)
            state.held = 0
        return state

    def restore(
        self, saved: bytes, last_time: int | None, *, fresh_monitor: bool = False
    ) -> StreamState:
        """The state `StreamState.to_bytes` wrote (or an earlier release's JSON checkpoint),
        after a reading at `last_time`; refused with a DataError if it does not fit this model
        and monitor. `fresh_monitor`: the detectors start afresh (they were reconfigured since
        the state was saved)."""
        parts = (
            SavedState.from_bytes(saved)
            if saved[: len(SAVED_MAGIC)] == SAVED_MAGIC
            else from_json(
                saved,
                forecaster=self.forecaster,
                monitor=self.monitor,
                channels=self.channels,
                window=self.window,
            )
        )
        forecaster = self.forecaster
        samples, run, since_imputed = parts.samples, parts.run, parts.since_imputed
        held = 0 if fresh_monitor else parts.held
        if (
            min(samples, run, since_imputed, parts.missing_run, held) < 0
            or max(run, since_imputed) > self.window
        ):
            raise DataError("stream state: counters out of range")
        carry = sized(parts.carry, (forecaster.carry_size,), "carry")
        if np.isnan(carry).any():
            raise DataError("stream state: the forecaster's carry must be numbers")
        if fresh_monitor:  # (its detectors' statistics are another monitor's: none yet)
            kept = 2 * self.targets
            monitor = self.monitor.new_state()
            latest = np.full(self._latest_size, np.nan)
            latest[:kept] = sized(parts.latest[:kept], (kept,), "latest")
        else:
            monitor = self.monitor.state_from_parts(parts.monitor_values, parts.rules)
            latest = sized(parts.latest, (self._latest_size,), "latest")
        return StreamState(
            samples=samples,
            last_time=last_time,
            run=run,
            since_imputed=since_imputed,
            missing_run=parts.missing_run,
            history=sized(parts.history, (forecaster.context, self.channels), "history"),
            carry=carry.astype(np.float32),
            pending=sized(parts.pending, (forecaster.outputs,), "pending"),
            monitor=monitor,
            latest=latest,
            held=held,
        )

    def warmup_remaining(self, state: StreamState) -> int:
        """Readings still needed before the stream forecasts (and alarms) again."""
        return self.window - state.run

    def forecast_ahead(self, state: StreamState, horizon: int) -> FloatArray:
        """The forecast of the next `horizon` readings, made after the last one."""
        if not 1 <= horizon <= self.forecaster.horizon:
            raise DataError(
                f"horizon must be between 1 and the model's horizon ({self.forecaster.horizon})"
            )
        if remaining := self.warmup_remaining(state):
            raise DataError(
                f"the stream is warming up: {remaining} more readings before it can forecast"
            )
        steps = state.pending.reshape(self.forecaster.horizon, self.targets)
        return steps[:horizon, 0].copy()

    @property
    def _latest_size(self) -> int:
        return 2 * self.targets + len(self.monitor.detectors)

    def latest(
        self, state: StreamState
    ) -> tuple[list[float | None], list[float | None], dict[str, float]]:
        """The last forecast and residual of each forecast channel, and the last statistics, a
        stream had (None or absent: none yet)."""
        values: list[float | None] = [
            None if math.isnan(x) else float(x) for x in state.latest.tolist()
        ]
        targets = self.targets
        statistics = {
            str(kind): value
            for kind, value in zip(self.monitor.kinds, values[2 * targets :], strict=True)
            if value is not None
        }
        return values[:targets], values[targets : 2 * targets], statistics

    # -- the recurrence --

    def advance(
        self, states: Sequence[StreamState], readings: Readings, periods: Sequence[float]
    ) -> BlockResult:
        """Advance each stream (`states[i]`, whose readings come every `periods[i]` seconds) by
        its readings, in place. Bad input raises a DataError before anything changes.

        Holding out. With a forecaster that can say how its error grows when it is fed its own
        forecasts (`Forecaster.spread_growth`: the learned linear models), a reading after
        which an alarm of a `HOLDING` detector is open does not enter the model's history:
        its forecast does, as for a missing reading. The model keeps forecasting what normal
        would look like, so a sustained fault stays visible for as long as it lasts (and its
        echo does not come back a season later), and the alarm closes when the readings are
        back where normal would be. The residuals of a stream holding readings out are
        divided by that growth (a forecast h readings ahead is less sure than the next one's),
        so a sensor that wanders has its alarm close once its wander covers the gap.

        A block runs all its streams at once; a stream whose alarm opens in it, or that
        holds readings out already, is run again from there one reading at a time (whether
        a reading enters the history depends on its own alarm), until its alarm closes."""
        if self._held_channels is None:
            return self._advance_block(states, readings, periods)
        before = [state.copy() for state in states]
        result = self._advance_block(states, readings, periods)
        counts = np.asarray(readings.counts, dtype=np.int64)
        for row, state in enumerate(states):
            earlier = before[row]
            if not counts[row] or not (
                earlier.held
                or self.monitor.holding(earlier.monitor)
                or any(e.detector in HOLDING for e in result.opened.get(row, ()))
            ):
                continue
            state.become(earlier)
            start = int(result.offsets[row])
            parts = self._one_by_one(
                state, readings.part(start, start + int(counts[row])), periods[row]
            )
            _replace(result, row, parts)
        return result

    def _one_by_one(
        self, state: StreamState, readings: Readings, period: float
    ) -> list[BlockResult]:
        """One stream's readings, as blocks while it holds nothing out and one at a time while
        it does (see `advance`)."""
        parts: list[BlockResult] = []
        total, position = int(readings.counts[0]), 0
        while position < total:
            if not state.held and not self.monitor.holding(state.monitor):
                earlier = state.copy()
                part = self._advance_block([state], readings.part(position, total), [period])
                opening = [
                    e.start - earlier.samples
                    for e in part.opened.get(0, ())
                    if e.detector in HOLDING
                ]
                if not opening:
                    parts.append(part)
                    break
                state.become(earlier)
                first = min(opening)
                if first:
                    parts.append(
                        self._advance_block(
                            [state], readings.part(position, position + first), [period]
                        )
                    )
                    position += first
            one = readings.part(position, position + 1)
            earlier = state.copy()
            part = self._advance_block([state], one, [period])
            if (
                self.monitor.holding(state.monitor)
                and not part.imputed[0]
                and np.isfinite(earlier.pending).all()
            ):
                state.become(earlier)
                part = self._advance_block([state], one, [period], hold=True)
            parts.append(part)
            position += 1
        return parts

    def _advance_block(
        self,
        states: Sequence[StreamState],
        readings: Readings,
        periods: Sequence[float],
        *,
        hold: bool = False,
    ) -> BlockResult:
        """`advance` for streams holding nothing out; `hold`: one stream's one reading is kept
        out of the history (its forecast enters it)."""
        counts = np.asarray(readings.counts, dtype=np.int64)
        values = np.asarray(readings.values, dtype=np.float64)
        total, streams = int(counts.sum()), len(states)
        if counts.shape != (streams,) or (counts < 0).any():
            raise DataError(f"{counts.shape} reading counts for {streams} streams")
        if values.shape != (total, self.channels):
            raise DataError(
                f"readings of shape {values.shape}: {total} readings of {self.channels} channel(s)"
            )
        if readings.times.shape != (total,):
            raise DataError(f"{readings.times.shape} times for {total} readings")
        if readings.references is not None and readings.references.shape != (total,):
            raise DataError(f"{readings.references.shape} references for {total} readings")
        if np.isinf(values).any():
            raise DataError("readings must be finite numbers or null")
        if readings.references is not None and np.isinf(readings.references).any():
            raise DataError("references must be finite numbers or null")

        offsets = np.zeros(streams + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        steps = int(counts.max()) if streams else 0
        if streams and (counts == steps).all():  # a tick, one stream's batch: no padding
            scatter = None
            block = values.reshape(streams, steps, self.channels).copy()
            present = np.ones((streams, steps), dtype=bool)
        else:
            row_of = np.repeat(np.arange(streams), counts)
            scatter = (row_of, np.arange(total) - offsets[row_of])
            block = np.full((streams, steps, self.channels), np.nan)
            block[scatter] = values
            present = np.zeros((streams, steps), dtype=bool)
            present[scatter] = True

        def padded(per_reading: np.ndarray, fill: Any) -> np.ndarray:
            if scatter is None:
                return per_reading.reshape(streams, steps)
            out = np.full((streams, steps), fill, dtype=per_reading.dtype)
            out[scatter] = per_reading
            return out

        def flat(per_position: np.ndarray) -> np.ndarray:
            """(N, T, ...) -> (R, ...): the readings given, in their order."""
            cut: np.ndarray = (
                per_position.reshape(-1, *per_position.shape[2:])
                if scatter is None
                else per_position[scatter]
            )
            return cut

        restart = padded(
            restarts(states, readings.times, offsets, counts, periods, self.max_gap), False
        )
        plan = plan_block(
            states,
            present,
            np.isnan(block).any(axis=2) & present,
            restart,
            counts,
            window=self.window,
            max_gap=self.max_gap,
        )
        held_before = np.array([state.held for state in states], dtype=np.int64)
        holding = np.zeros((streams, steps), dtype=bool)
        if hold:
            holding[:] = plan.action == REAL
        forecast = self._forecast(states, block, plan, holding)

        has_forecast = (plan.action == REAL) & plan.warm
        targets = self.targets
        residual = np.where(has_forecast[:, :, None], block[:, :, :targets] - forecast, np.nan)
        monitored = has_forecast & plan.clean & ~np.isnan(residual).any(axis=2)
        gaps = np.full((streams, steps), np.nan)
        if readings.references is not None:
            reference = padded(readings.references, np.nan)
            gaps = np.where(
                has_forecast & ~np.isnan(forecast[:, :, 0]), block[:, :, 0] - reference, np.nan
            )
        missing = None
        if "missing" in self.monitor.kinds:  # (only a monitor that watches for them)
            missing = np.where(present, (plan.action >= IMPUTED).astype(np.float64), np.nan)
        first_samples = [state.samples for state in states]
        watched_residual = np.where(monitored[:, :, None], residual, np.nan)
        held_out = None
        if held_before.any():
            growth = np.ones((streams, targets))
            for row in np.flatnonzero(held_before).tolist():
                spread = self.forecaster.spread_growth(int(held_before[row]) + 1)
                assert spread is not None
                growth[row] = np.nan_to_num(spread, nan=1.0)
            watched_residual = watched_residual / growth[:, None, :]
            assert self._held_channels is not None
            held_out = (held_before[:, None] > 0) & self._held_channels[None, :targets]
        watched = self.monitor.advance(
            [state.monitor for state in states],
            watched_residual,
            None if readings.references is None else gaps,
            first_samples=first_samples,
            missing=missing,
            held_out=held_out,
            readings=np.where(monitored[:, :, None], block[:, :, :targets], np.nan)
            if "frozen" in self.monitor.kinds
            else None,
        )
        forecast = np.where(plan.warm[:, :, None], forecast, np.nan)
        self._remember_latest(states, forecast, residual, watched.statistics)
        appended = (plan.action == REAL) | (plan.action == IMPUTED)
        for row, state in enumerate(states):
            if counts[row]:
                state.samples += int(counts[row])
                state.last_time = int(readings.times[offsets[row + 1] - 1])
                if hold or (state.held and (plan.action[row] == IMPUTED).all()):
                    state.held += int(appended[row].sum())
                elif appended[row].any() or plan.fresh[row].any():
                    state.held = 0

        return BlockResult(
            offsets=offsets,
            first_samples=first_samples,
            forecast=flat(forecast),
            residual=flat(residual),
            imputed=flat(plan.action == IMPUTED),
            monitored=flat(monitored),
            reference_gap=flat(gaps),
            statistics={kind: flat(values) for kind, values in watched.statistics.items()},
            opened=watched.opened,
            closed=watched.closed,
        )

    def _remember_latest(
        self,
        states: Sequence[StreamState],
        forecast: np.ndarray,
        residual: np.ndarray,
        statistics: Mapping[str, np.ndarray],
    ) -> None:
        """Each stream's last forecast, residual and statistics, for what reads show."""
        series = np.array(
            [
                *forecast.transpose(2, 0, 1),
                *residual.transpose(2, 0, 1),
                *(statistics[k] for k in self.monitor.kinds),
            ]
        )
        known = ~np.isnan(series)  # (quantities, N, T)
        steps = series.shape[2]
        if steps == 1:
            newest, seen = series[:, :, 0], known[:, :, 0]
        else:
            last = steps - 1 - np.argmax(known[:, :, ::-1], axis=2)  # (quantities, N)
            newest = np.take_along_axis(series, last[:, :, None], axis=2)[:, :, 0]
            seen = known.any(axis=2)
        latest = np.where(seen.T, newest.T, np.array([state.latest for state in states]))
        for row, state in enumerate(states):
            state.latest = latest[row].copy()  # (a view would keep the whole block alive)

    def _forecast(
        self, states: Sequence[StreamState], block: np.ndarray, plan: Plan, holding: np.ndarray
    ) -> np.ndarray:
        """Each reading's forecast of each target, (N, T, targets) (NaN where none), the
        forecaster called once per stretch of
        readings that no stream interrupts; imputed readings are written into `block`.

        A stretch ends where a stream's reading is imputed (its value is the forecast the
        previous stretch ends with), dropped, starts a run, or where a stream's readings end."""
        forecaster = self.forecaster
        streams, steps = plan.action.shape
        targets = self.targets
        forecast = np.full((streams, steps, targets), np.nan)
        if not streams or not steps:
            return forecast
        history = np.array([state.history for state in states])
        carry = np.array([state.carry for state in states])
        pending = np.array([state.pending for state in states])
        appended = (plan.action == REAL) | (plan.action == IMPUTED)
        cuts = [0, steps]
        if steps > 1:
            breaks = (plan.action == IMPUTED) | (plan.action == DROPPED) | plan.fresh | holding
            breaks[:, 1:] |= appended[:, 1:] != appended[:, :-1]
            cuts = [0, *np.flatnonzero(breaks[:, 1:].any(axis=0)) + 1, steps]
        for start, stop in itertools.pairwise(cuts):
            selected = np.flatnonzero(appended[:, start])
            if not selected.size:
                continue
            # Every stream (a tick, a batch): slices, not copies.
            rows = slice(None) if selected.size == streams else selected
            fresh = selected[plan.fresh[selected, start]]
            if fresh.size:
                history[fresh] = np.nan
                carry[fresh] = forecaster.initial_carry(fresh.size)
                pending[fresh] = np.nan
            imputed = selected[plan.action[selected, start] == IMPUTED]
            if imputed.size:
                guess = block[imputed, start].copy()
                guess[:, :targets] = np.where(
                    np.isnan(guess[:, :targets]), pending[imputed, :targets], guess[:, :targets]
                )
                block[imputed, start] = np.where(np.isnan(guess), history[imputed, -1], guess)
            stretch = block[rows, start:stop]
            kept_out = selected[holding[selected, start]]
            if kept_out.size:  # (held out: its forecast enters the history, not the reading)
                stretch = stretch.copy()
                at = np.searchsorted(selected, kept_out)
                assert self._held_channels is not None
                stretch[at, 0, :targets] = np.where(
                    self._held_channels[:targets],
                    pending[kept_out, :targets],
                    stretch[at, 0, :targets],
                )
            made, carry[rows] = forecaster.advance(history[rows], stretch, carry[rows])
            forecast[rows, start] = pending[rows, :targets]
            forecast[rows, start + 1 : stop] = made[:, :-1, :targets]
            pending[rows] = made[:, -1]
            context = forecaster.context
            history[rows] = np.concatenate((history[rows], stretch), axis=1)[:, -context:]
        for row, state in enumerate(states):  # (copies: a view would keep the block alive)
            state.history, state.carry = history[row].copy(), carry[row].copy()
            state.pending = pending[row].copy()
        return forecast


def _replace(result: BlockResult, row: int, parts: Sequence[BlockResult]) -> None:
    """Stream `row`'s part of `result` redone as `parts` (one stream's blocks, in order)."""
    start, stop = int(result.offsets[row]), int(result.offsets[row + 1])
    for name in ("forecast", "residual", "imputed", "monitored", "reference_gap"):
        getattr(result, name)[start:stop] = np.concatenate([getattr(p, name) for p in parts])
    for kind, values in result.statistics.items():
        values[start:stop] = np.concatenate([p.statistics[kind] for p in parts])
    for events, name in ((result.opened, "opened"), (result.closed, "closed")):
        redone = [e for p in parts for e in getattr(p, name).get(0, ())]
        if redone:
            events[row] = redone
        else:
            events.pop(row, None)
