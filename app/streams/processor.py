"""The per-stream recurrence: state_t = step(state_{t-1}, reading_t), computed a batch at a time.

For each reading the processor forecasts it from the window of the W readings before it,
computes the residual, advances the stream's monitor (detectors and alarm rules) and appends the
reading to the window. A batch of readings is processed with exactly the semantics of one reading
at a time, but the forecaster runs once on all the batch's windows.

Missing readings (null values) follow one documented rule:

- A null reading is imputed with its own forecast so the window stays complete; it has no
  residual. A null during warm-up, or more than `max_gap` nulls in a row, restart the warm-up
  (the window is emptied): no forecast is made from fabricated data.
- A gap in time longer than `max_gap` sample periods also restarts the warm-up.
- The monitor sees nothing (no residual, no reference gap) until the window is warm, and no
  residual whose window holds an imputed value: a gap never causes an alarm storm, and the live
  stream feeds the monitor exactly what the offline evaluation feeds it (residuals of windows
  with a missing value are NaN there too).

A stateful forecaster (`lstm-stateful`) carries its recurrent state (h, c) in the stream's state
instead of re-reading the window: each reading costs one LSTM step. Its window is kept only for
the bookkeeping above (warm-up, imputed readings), so both kinds follow the same rules.

`advance` moves a state on in place (the engine's path: on a failed commit the engine drops the
live state and rebuilds it from the database); `process` is the pure form, which copies first.
`advance_many` moves many streams on at once: streams with one reading each share one
forecaster call (one batched LSTM step for all of them), the rest go one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic_core import to_json

from app.errors import AppError, DataError
from app.forecasting.base import Forecaster
from app.forecasting.stateful_lstm import (
    LSTMState,
    StatefulLSTMForecaster,
    state_from_json,
    state_to_json,
)
from app.monitoring.alarms import AlarmEvent
from app.monitoring.monitor import Monitor, MonitorConfig, MonitorSteps

STATE_VERSION = 1
DEFAULT_MAX_GAP = 10
STEADY_TICKS = 8
"""From this many single readings on, `advance_tick` looks for steady streams to step together."""
DEFAULT_CHECKPOINT_EVERY = 1000
"""Readings between two checkpoints of a stream: what a restart replays at most."""
RUN_AHEAD_MIN = 64
"""From this many readings of one stream on, `run_ahead` runs the stateful model before the
batch is validated, while a helper thread checks it (below, the hand-off costs more than it
hides)."""


@dataclass(slots=True)
class RunAhead:
    """A stateful model's run over a batch (`readings`: the window's last reading, then the
    batch) from `recurrent`, computed before the batch was validated (`run_ahead`); `_run`
    takes its result only for exactly these inputs, else computes its own."""

    recurrent: LSTMState
    readings: np.ndarray
    result: tuple[np.ndarray, LSTMState]

    def matches(self, readings: np.ndarray, recurrent: LSTMState) -> bool:
        return (
            recurrent is self.recurrent
            and readings.shape == self.readings.shape
            and np.array_equal(readings, self.readings)
        )


@dataclass(slots=True)
class WindowRing:
    """A steady stream's window as a view into a buffer of twice its length: a new reading is
    written in place and the view moves on, so the window is copied once every W readings
    instead of once per reading. A window set by any other path is taken in afresh."""

    buffer: np.ndarray  # (2W, C)
    end: int  # the window is buffer[end - W : end]
    view: np.ndarray

    @classmethod
    def of(cls, window: np.ndarray) -> WindowRing:
        length = window.shape[0]
        buffer = np.empty((2 * length, window.shape[1]))
        buffer[:length] = window
        return cls(buffer, length, buffer[:length])

    def push(self, row: np.ndarray) -> np.ndarray:
        """The window with `row` appended and its oldest reading dropped."""
        buffer, end, length = self.buffer, self.end, self.view.shape[0]
        if end == buffer.shape[0]:
            buffer[: length - 1] = buffer[end - length + 1 : end]
            end = length - 1
        buffer[end] = row
        self.end = end = end + 1
        self.view = buffer[end - length : end]
        return self.view


@dataclass
class StreamState:
    """Everything a stream carries from one reading to the next. O(W) memory, whatever its age."""

    samples: int  # readings seen (the sample index of the next one)
    window: np.ndarray  # (filled <= W, C): the readings the next forecast reads, imputed included
    imputed: np.ndarray  # (filled,) bool: which of them were imputed
    monitor: Monitor
    missing_run: int = 0  # consecutive null readings just seen
    last_forecast: float | None = None
    last_residual: float | None = None
    last_statistics: dict[str, float] = field(default_factory=dict)  # detector -> last value
    # A stateful forecaster's (h, c) after the window's last reading and the forecast it made
    # then ((horizon,)); None for window forecasters and while the window is empty.
    recurrent: LSTMState | None = None
    pending: np.ndarray | None = None
    # The run over the batch being validated, when `StreamProcessor.run_ahead` started one.
    ahead: RunAhead | None = field(default=None, repr=False, compare=False)
    # What `window` is a view of while the stream is steady (see `_advance_steady`).
    ring: WindowRing | None = field(default=None, repr=False, compare=False)

    def copy(self) -> StreamState:
        """An independent copy (the monitor through its exact JSON state)."""
        return StreamState(
            samples=self.samples,
            window=self.window.copy(),
            # A read-only array is shared (the processor's all-real window marker): never
            # written in place, and its identity is what marks a steady stream.
            imputed=self.imputed if not self.imputed.flags.writeable else self.imputed.copy(),
            monitor=Monitor.from_state(self.monitor.config, self.monitor.state_dict()),
            missing_run=self.missing_run,
            last_forecast=self.last_forecast,
            last_residual=self.last_residual,
            last_statistics=dict(self.last_statistics),
            recurrent=None
            if self.recurrent is None
            else LSTMState(h=self.recurrent.h.copy(), c=self.recurrent.c.copy()),
            pending=None if self.pending is None else self.pending.copy(),
        )

    def to_bytes(self) -> bytes:
        """`to_json` as JSON text, the checkpoint: written by pydantic-core (a seventh of the
        time of `json.dumps`; floats as exact); a non-finite number is refused, as
        `json.dumps(..., allow_nan=False)` would."""
        blob = to_json(self.to_json(), inf_nan_mode="constants")
        if b"NaN" in blob or b"Infinity" in blob:
            raise ValueError("a stream state holds a non-finite number")
        return blob

    def to_json(self) -> dict[str, Any]:
        """Exact (floats round-trip through JSON) and versioned."""
        return {
            "version": STATE_VERSION,
            "samples": self.samples,
            "window": self.window.tolist(),
            "imputed": self.imputed.tolist(),
            "missing_run": self.missing_run,
            "last_forecast": self.last_forecast,
            "last_residual": self.last_residual,
            "last_statistics": self.last_statistics,
            "monitor": self.monitor.state_dict(),
            "recurrent": None if self.recurrent is None else state_to_json(self.recurrent),
            "pending": None
            if self.pending is None
            else [None if math.isnan(x) else x for x in self.pending.tolist()],
        }


class BatchResult:
    """What a batch did, one entry per reading, plus the alarm transitions it caused.

    The per-reading arrays of a stream stepped together with others are its rows of arrays
    over all of them, sliced only when read: most answers (a gateway's acknowledgement) never
    read them, and one slice per quantity and stream costs more than the step itself."""

    __slots__ = ("_columns", "_rows", "_stats", "closed", "first_sample", "open_events", "opened")

    first_sample: int
    opened: list[AlarmEvent]
    closed: list[AlarmEvent]
    open_events: list[AlarmEvent]  # every event open after the batch, with its peak so far

    def __init__(
        self,
        *,
        first_sample: int,
        forecast: np.ndarray,  # NaN while warming up
        residual: np.ndarray,  # NaN without forecast or reading
        imputed: np.ndarray,  # bool: the reading was null and was imputed with its forecast
        monitored: np.ndarray,  # bool: the residual reached the detectors
        statistics: dict[str, np.ndarray],  # detector -> statistic (NaN: none)
        opened: list[AlarmEvent],
        closed: list[AlarmEvent],
        open_events: list[AlarmEvent],
    ) -> None:
        columns = {
            "forecast": forecast,
            "residual": residual,
            "imputed": imputed,
            "monitored": monitored,
        }
        self._set(first_sample, columns, statistics, slice(None), opened, closed, open_events)

    def _set(
        self,
        first_sample: int,
        columns: dict[str, np.ndarray],
        statistics: dict[str, np.ndarray],
        rows: slice,
        opened: list[AlarmEvent],
        closed: list[AlarmEvent],
        open_events: list[AlarmEvent],
    ) -> None:
        self.first_sample = first_sample
        self._columns, self._stats, self._rows = columns, statistics, rows
        self.opened, self.closed, self.open_events = opened, closed, open_events

    @classmethod
    def row_of(
        cls,
        row: int,
        first_sample: int,
        columns: dict[str, np.ndarray],
        statistics: dict[str, np.ndarray],
        opened: list[AlarmEvent],
        closed: list[AlarmEvent],
        open_events: list[AlarmEvent],
    ) -> BatchResult:
        """One stream's result: row `row` of `columns` (the four arrays `__init__` takes, by
        name) and `statistics`, arrays over many streams with one reading each."""
        result = cls.__new__(cls)
        result._set(
            first_sample, columns, statistics, slice(row, row + 1), opened, closed, open_events
        )
        return result

    @property
    def forecast(self) -> np.ndarray:
        return self._columns["forecast"][self._rows]

    @property
    def residual(self) -> np.ndarray:
        return self._columns["residual"][self._rows]

    @property
    def imputed(self) -> np.ndarray:
        return self._columns["imputed"][self._rows]

    @property
    def monitored(self) -> np.ndarray:
        return self._columns["monitored"][self._rows]

    @property
    def statistics(self) -> dict[str, np.ndarray]:
        return {kind: column[self._rows] for kind, column in self._stats.items()}


@dataclass
class _Plan:
    """One reading of one stream between the bookkeeping and its forecaster call."""

    state: StreamState
    value: np.ndarray  # (C,), NaN for null
    reference: float  # NaN: none
    missing: bool
    predict: bool = False  # window forecaster: forecast from the window before the reading
    step: bool = False  # stateful forecaster: step from the last reading to this one
    row: np.ndarray | None = None  # what joins the window (the reading, or its imputation)
    forecast: float = math.nan
    imputed: bool = False
    step_output: tuple[np.ndarray, LSTMState] | None = None


class StreamProcessor:
    """One model's recurrence; shared by every stream that uses the model."""

    def __init__(
        self,
        forecaster: Forecaster,
        monitor_config: MonitorConfig,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
    ) -> None:
        if forecaster.n_channels != monitor_config.channels and monitor_config.channels != 1:
            raise ValueError("the monitor watches channel 0 or one residual per channel")
        self.forecaster = forecaster
        self.monitor_config = monitor_config
        self.max_gap = max_gap
        self.window = forecaster.window
        self.channels = forecaster.n_channels
        self.stateful: StatefulLSTMForecaster | None = (
            forecaster if isinstance(forecaster, StatefulLSTMForecaster) else None
        )
        # The `imputed` of every full window of real readings, shared (never written in
        # place): `state.imputed is self._all_real` tells a steady stream in O(1).
        self._all_real = np.zeros(self.window, dtype=bool)
        self._all_real.flags.writeable = False

    def new_state(self) -> StreamState:
        return StreamState(
            samples=0,
            window=np.empty((0, self.channels)),
            imputed=np.zeros(0, dtype=bool),
            monitor=Monitor(self.monitor_config),
        )

    def restore(self, saved: dict[str, Any]) -> StreamState:
        """The state `StreamState.to_json` wrote, refused with DataError if it does not fit."""
        if saved.get("version") != STATE_VERSION:
            raise DataError(f"stream state version {saved.get('version')!r} is not supported")
        window = np.asarray(saved["window"], dtype=np.float64).reshape(-1, self.channels)
        imputed = np.asarray(saved["imputed"], dtype=bool)
        if window.shape[0] > self.window or imputed.shape != (window.shape[0],):
            raise DataError("stream state window does not fit the model")
        monitor = Monitor.from_state(self.monitor_config, saved["monitor"])
        if monitor.sample != saved["samples"]:
            raise DataError("stream state and monitor state disagree on the sample count")
        recurrent, pending = None, None
        if self.stateful is not None and window.shape[0]:
            if saved.get("recurrent") is None or saved.get("pending") is None:
                raise DataError("stream state has no recurrent state for a stateful model")
            try:
                recurrent = state_from_json(saved["recurrent"])
            except AppError as exc:
                raise DataError(f"stream state: {exc.detail}") from None
            pending = np.array(
                [math.nan if x is None else x for x in saved["pending"]], dtype=np.float64
            )
            expected = (self.stateful.layers, 1, self.stateful.hidden)
            if recurrent.h.shape != expected or pending.shape != (self.stateful.horizon,):
                raise DataError("stream state's recurrent state does not fit the model")
        return StreamState(
            samples=int(saved["samples"]),
            window=window,
            imputed=self._marked(imputed),
            monitor=monitor,
            missing_run=int(saved["missing_run"]),
            last_forecast=saved.get("last_forecast"),
            last_residual=saved.get("last_residual"),
            last_statistics={k: float(v) for k, v in saved.get("last_statistics", {}).items()},
            recurrent=recurrent,
            pending=pending,
        )

    def _marked(self, imputed: np.ndarray) -> np.ndarray:
        """`imputed`, or the shared all-real marker if that is what it says."""
        if imputed.shape[0] == self.window and not imputed.any():
            return self._all_real
        return imputed

    def can_run_ahead(self, state: StreamState, values: np.ndarray) -> bool:
        """Whether `run_ahead` would compute anything for this batch: a long batch of real
        readings of a warm stateful stream (below RUN_AHEAD_MIN the checks it lets run beside
        the forecasts cost less than handing them over)."""
        return (
            self.stateful is not None
            and state.recurrent is not None
            and values.shape[0] >= RUN_AHEAD_MIN
            and state.window.shape[0] > 0
            and bool(np.isfinite(values).all())
        )

    def run_ahead(self, state: StreamState, values: np.ndarray) -> None:
        """Run the stateful model over a long batch that continues the stream before the batch
        is validated (the engine checks its times meanwhile, in another thread: the LSTM
        releases the GIL). `advance` uses the run if the batch turns out to be what was assumed
        (no time gap), else ignores it."""
        state.ahead = None
        if not self.can_run_ahead(state, values):
            return
        assert self.stateful is not None and state.recurrent is not None
        readings = np.concatenate((state.window[-1:], values))
        result = self.stateful.run(readings, state.recurrent)
        state.ahead = RunAhead(state.recurrent, readings, result)

    def warmup_remaining(self, state: StreamState) -> int:
        """Readings still needed before the stream forecasts (and alarms) again."""
        return self.window - int(state.window.shape[0])

    # -- processing --

    def process(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None = None,
        restart: np.ndarray | None = None,
    ) -> tuple[StreamState, BatchResult]:
        """The pure form of `advance`: the given state is left as it was."""
        new_state = state.copy()
        return new_state, self.advance(new_state, values, references, restart)

    def advance(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None = None,
        restart: np.ndarray | None = None,
    ) -> BatchResult:
        """Advance `state` in place by a batch and say what happened.

        values: (N, C) readings, NaN for null; references: (N,) reference readings (NaN: none);
        restart: (N,) bool, True where a long time gap precedes the reading. Bad input raises
        DataError before anything changes.
        """
        return self.advance_many([(state, values, references, restart)])[0]

    def advance_many(
        self,
        batches: list[tuple[StreamState, np.ndarray, np.ndarray | None, np.ndarray | None]],
    ) -> list[BatchResult]:
        """`advance` for many streams' batches (one per stream), each with the semantics of
        processing it alone; every stream with a single reading shares one forecaster call."""
        checked = [self._check(*batch, finite=False) for batch in batches]
        # All validated before any change.
        self._refuse_infinite([batch[1] for batch in checked], [batch[2] for batch in checked])
        results: list[BatchResult | None] = [None] * len(checked)
        singles = [i for i, batch in enumerate(checked) if batch[1].shape[0] == 1]
        for index, batch in enumerate(checked):
            if batch[1].shape[0] != 1:
                results[index] = self._advance_batch(*batch)
        if singles:
            given = [checked[i][2] for i in singles]
            made = self._advance_tick(
                [checked[i][0] for i in singles],
                np.concatenate([checked[i][1] for i in singles]),
                None
                if all(reference is None for reference in given)
                else np.array([math.nan if r is None else r[0] for r in given]),
                np.concatenate([checked[i][3] for i in singles]),
            )
            for index, result in zip(singles, made, strict=True):
                results[index] = result
        return [result for result in results if result is not None]

    def advance_tick(
        self,
        states: list[StreamState],
        values: np.ndarray,
        references: np.ndarray | None = None,
        restart: np.ndarray | None = None,
    ) -> list[BatchResult]:
        """One reading for each of many streams (a gateway's tick): row i of `values` ((N, C)
        or (N,)), `references` and `restart` ((N,)) is stream i's. The same as `advance_many`
        with a one-reading batch per stream, without building the batches."""
        count = len(states)
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 1:
            values = values[:, None]
        if values.shape != (count, self.channels):
            raise DataError(f"readings of shape {values.shape} for {count} streams")
        if references is not None:
            references = np.asarray(references, dtype=np.float64)
            if references.shape != (count,):
                raise DataError(f"{references.shape[0]} references for {count} streams")
        restart = np.zeros(count, dtype=bool) if restart is None else np.asarray(restart, bool)
        if restart.shape != (count,):
            raise DataError(f"{restart.shape[0]} restart flags for {count} streams")
        self._refuse_infinite([values], [references])
        return self._advance_tick(states, values, references, restart)

    def _advance_tick(
        self,
        states: list[StreamState],
        values: np.ndarray,
        references: np.ndarray | None,
        restart: np.ndarray,
    ) -> list[BatchResult]:
        results: list[BatchResult | None] = [None] * len(states)
        steady, planned = self._steady(states, values, restart)
        if steady:
            made = self._advance_steady(
                [states[i] for i in steady],
                values[steady],
                None if references is None else references[steady],
            )
            for index, result in zip(steady, made, strict=True):
                results[index] = result
        if planned:
            plans = [
                self._plan(
                    states[i],
                    values[i : i + 1],
                    None if references is None else references[i : i + 1],
                    restart[i : i + 1],
                )
                for i in planned
            ]
            self._forecast_plans(plans)
            for index, result in zip(planned, self._finish(plans), strict=True):
                results[index] = result
        return [result for result in results if result is not None]

    def _steady(
        self, states: list[StreamState], values: np.ndarray, restart: np.ndarray
    ) -> tuple[list[int], list[int]]:
        """Split a tick's streams into the steady ones (a real reading, no time gap before it,
        a full window of real readings: a live stream's every tick) and the rest."""
        if len(states) < STEADY_TICKS:
            return [], list(range(len(states)))
        irregular = (np.isnan(values).any(axis=1) | restart).tolist()
        all_real = self._all_real
        steady, planned = [], []
        for index, (state, odd) in enumerate(zip(states, irregular, strict=True)):
            if odd or state.imputed is not all_real:
                planned.append(index)
            else:
                steady.append(index)
        return steady, planned

    def _check(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None,
        restart: np.ndarray | None,
        *,
        finite: bool = True,
    ) -> tuple[StreamState, np.ndarray, np.ndarray | None, np.ndarray]:
        """Shapes checked (and, if `finite`, infinities refused); arrays as the steps take them."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 1:
            values = values[:, None]
        count = values.shape[0]
        if values.shape != (count, self.channels):
            raise DataError(
                f"readings have {values.shape[1]} channel(s), the model reads {self.channels}"
            )
        if references is not None:
            references = np.asarray(references, dtype=np.float64)
            if references.shape != (count,):
                raise DataError(f"{references.shape[0]} references for {count} readings")
        restart = np.zeros(count, dtype=bool) if restart is None else np.asarray(restart, bool)
        checked = state, values, references, restart
        if finite:
            self._refuse_infinite([values], [references])
        return checked

    @staticmethod
    def _refuse_infinite(values: list[np.ndarray], references: list[np.ndarray | None]) -> None:
        """One test for all the batches: per batch, numpy's overhead would cost more than it."""
        if not values:
            return
        if np.isinf(np.concatenate([array.ravel() for array in values])).any():
            raise DataError("readings must be finite numbers or null")
        given = [array for array in references if array is not None]
        if given and np.isinf(np.concatenate(given)).any():
            raise DataError("references must be finite numbers or null")

    # -- one reading: bookkeeping, one (shared) forecaster call, monitor --

    def _plan(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None,
        restart: np.ndarray,
    ) -> _Plan:
        value = values[0]
        plan = _Plan(
            state=state,
            value=value,
            reference=math.nan if references is None else float(references[0]),
            missing=any(math.isnan(x) for x in value.tolist()),
        )
        if restart[0]:
            self._empty_window(state)
        filled = state.window.shape[0]
        if plan.missing:
            state.missing_run += 1
            if state.missing_run > self.max_gap or filled < self.window:
                self._empty_window(state)  # restart the warm-up: nothing to impute from
                return plan
            plan.imputed = True
        else:
            state.missing_run = 0
        if self.stateful is None:
            plan.predict = filled >= self.window
        else:
            if filled >= self.window:
                assert state.pending is not None
                plan.forecast = float(state.pending[0])
            if plan.imputed:
                plan.row = self._imputed_row(plan.value, plan.forecast, state.window[-1])
            plan.step = filled > 0
        return plan

    def _forecast_plans(self, plans: list[_Plan]) -> None:
        """Every plan's forecaster work in one call: windows predicted, or streams stepped."""
        wanted = [plan for plan in plans if plan.predict]
        if wanted:
            windows = np.stack([plan.state.window for plan in wanted])
            for plan, forecast in zip(wanted, self.forecaster.predict(windows)[:, 0], strict=True):
                plan.forecast = float(forecast)
                if plan.imputed:
                    plan.row = self._imputed_row(plan.value, plan.forecast, plan.state.window[-1])
        stepping = [plan for plan in plans if plan.step]
        if stepping and self.stateful is not None:
            recurrent = [plan.state.recurrent for plan in stepping]
            assert all(state is not None for state in recurrent)
            before = LSTMState.stack([state for state in recurrent if state is not None])
            previous = np.stack([plan.state.window[-1] for plan in stepping])
            current = np.stack([plan.value if plan.row is None else plan.row for plan in stepping])
            forecasts, after = self.stateful.step(before, previous, current)
            for row, plan in enumerate(stepping):
                # Views into the batch's arrays, not copies: a state is never written in place.
                own = LSTMState(h=after.h[:, row : row + 1], c=after.c[:, row : row + 1])
                plan.step_output = (forecasts[row], own)

    def _finish(self, plans: list[_Plan]) -> list[BatchResult]:
        """Residuals, one monitor step for all the plans' streams together, then each state.

        The per-reading arrays of the results are one-element views of arrays over all the
        plans: one numpy call per quantity instead of one per quantity and stream."""
        residuals: list[float] = []
        watched: list[float] = []  # what the monitor sees: the residual, or NaN
        gaps: list[float] = []
        monitored: list[bool] = []
        clean: list[bool] = []  # no imputed reading in the window
        for plan in plans:
            residual = math.nan if plan.imputed else float(plan.value[0]) - plan.forecast
            clean.append(not plan.state.imputed.any())
            seen = clean[-1] and not math.isnan(residual)
            has_gap = not (plan.imputed or math.isnan(plan.reference) or math.isnan(plan.forecast))
            residuals.append(residual)
            watched.append(residual if seen else math.nan)
            gaps.append(float(plan.value[0]) - plan.reference if has_gap else math.nan)
            monitored.append(seen)
        steps = Monitor.update_many(
            [plan.state.monitor for plan in plans], np.array(watched), np.array(gaps)
        )
        columns = {
            "forecast": np.array([plan.forecast for plan in plans]),
            "residual": np.array(residuals),
            "imputed": np.array([plan.imputed for plan in plans]),
            "monitored": np.array(monitored),
        }
        latest = {kind: column.tolist() for kind, column in steps.statistics.items()}
        results = []
        for index, plan in enumerate(plans):
            self._append(plan, clean=clean[index])
            self._remember(plan.state, plan.forecast, residuals[index], latest, index)
            results.append(self._result(plan.state, index, columns, steps))
        return results

    def _advance_steady(
        self, states: list[StreamState], values: np.ndarray, references: np.ndarray | None
    ) -> list[BatchResult]:
        """`_plan`, `_forecast_plans` and `_finish` for steady streams (see `_steady`), with
        one numpy call per quantity across them: the same arithmetic on the same numbers."""
        stateful = self.stateful
        if stateful is not None:
            pending = [state.pending for state in states]
            forecast = np.array([p[0] for p in pending if p is not None], dtype=np.float64)
            recurrent = [state.recurrent for state in states if state.recurrent is not None]
            if len(forecast) != len(states) or len(recurrent) != len(states):
                raise AssertionError("a warm stream of a stateful model has its state")
            previous = np.stack([state.window[-1] for state in states])
            made, after = stateful.step(LSTMState.stack(recurrent), previous, values)
        else:
            windows = np.stack([state.window for state in states])
            forecast = self.forecaster.predict(windows)[:, 0].astype(np.float64)
        residual = values[:, 0] - forecast
        has_forecast = ~np.isnan(forecast)
        gaps = None
        if references is not None:
            gaps = np.where(has_forecast, values[:, 0] - references, np.nan)
        steps = Monitor.update_many([state.monitor for state in states], residual, gaps)
        columns = {
            "forecast": forecast,
            "residual": residual,
            "imputed": np.zeros(len(states), dtype=bool),
            "monitored": ~np.isnan(residual),
        }
        latest = {kind: column.tolist() for kind, column in steps.statistics.items()}
        forecasts, residuals = forecast.tolist(), residual.tolist()
        if stateful is not None:
            # Each stream's (layers, 1, hidden) view of the tick's state, by iteration.
            own_h = after.h.transpose(1, 0, 2)[:, :, None]
            own_c = after.c.transpose(1, 0, 2)[:, :, None]
            for state, forecasts_made, h, c in zip(states, made, own_h, own_c, strict=True):
                state.pending, state.recurrent = forecasts_made, LSTMState(h, c)
        results = []
        for index, (state, row) in enumerate(zip(states, values, strict=True)):
            ring = state.ring
            if ring is None or ring.view is not state.window:
                ring = state.ring = WindowRing.of(state.window)
            state.window = ring.push(row)
            state.missing_run = 0
            self._remember(state, forecasts[index], residuals[index], latest, index)
            results.append(self._result(state, index, columns, steps))
        return results

    @staticmethod
    def _remember(
        state: StreamState,
        forecast: float,
        residual: float,
        statistics: dict[str, list[float]],
        row: int,
    ) -> None:
        """The last forecast, residual and statistics a stream had (NaN: none now)."""
        if forecast == forecast:  # not NaN
            state.last_forecast = forecast
        if residual == residual:
            state.last_residual = residual
        for kind, column in statistics.items():
            if (statistic := column[row]) == statistic:
                state.last_statistics[kind] = statistic
        state.samples += 1

    @staticmethod
    def _result(
        state: StreamState, row: int, columns: dict[str, np.ndarray], steps: MonitorSteps
    ) -> BatchResult:
        return BatchResult.row_of(
            row,
            steps.samples[row],
            columns,
            steps.statistics,
            steps.opened.get(row, []),
            steps.closed.get(row, []),
            state.monitor.open_events() if row in steps.still_open else [],
        )

    def _append(self, plan: _Plan, *, clean: bool) -> None:
        """Move the plan's window past its reading (`clean`: no imputed reading in it)."""
        state = plan.state
        W = self.window
        if plan.row is not None or not plan.missing:  # the reading (or its stand-in) joins
            if self.stateful is not None:
                if plan.step_output is None:  # the first reading of a run: a fresh state
                    state.recurrent = self.stateful.initial_state(1)
                    state.pending = np.full(self.stateful.horizon, np.nan)
                else:
                    state.pending, state.recurrent = plan.step_output
            row = plan.value if plan.row is None else plan.row
            state.window = np.concatenate([state.window[-(W - 1) :], row[None]])
            if not (clean and not plan.imputed and state.imputed.shape[0] == W):
                # (else it is the all-real marker already)
                imputed = np.concatenate((state.imputed[-(W - 1) :], (plan.imputed,)))
                state.imputed = self._marked(imputed)

    def _empty_window(self, state: StreamState) -> None:
        state.window = np.empty((0, self.channels))
        state.imputed = np.zeros(0, dtype=bool)
        state.recurrent = None
        state.pending = None

    @staticmethod
    def _imputed_row(value: np.ndarray, guess: float, last: np.ndarray) -> np.ndarray:
        """A null reading's stand-in: its forecast, and the last reading on other null channels."""
        row = value.copy()
        row[0] = guess if math.isnan(row[0]) else row[0]
        nan_channels = np.isnan(row)
        row[nan_channels] = last[nan_channels]
        return row

    # -- a batch of one stream: runs of readings forecast in one call each --

    def _advance_batch(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None,
        restart: np.ndarray,
    ) -> BatchResult:
        count = values.shape[0]
        W = self.window
        kept = state.window.shape[0]
        buffer = np.empty((kept + count, self.channels))
        buffer[:kept] = state.window
        imputed_buffer = np.zeros(kept + count, dtype=bool)
        imputed_buffer[:kept] = state.imputed
        recurrent, pending = state.recurrent, state.pending  # stateful: after buffer[end - 1]
        ahead, state.ahead = state.ahead, None
        # Per reading: its position in `buffer` (-1 when it is not appended) and the position
        # where its window's continuous run begins.
        forecast = np.full(count, np.nan)
        imputed = np.zeros(count, dtype=bool)
        position = np.full(count, -1, dtype=np.int64)
        run_start = 0
        end = kept
        missing_run = state.missing_run
        missing = np.isnan(values).any(axis=1)
        breaks = np.append(np.flatnonzero(missing | restart), count)  # where runs of real end
        index = 0
        while index < count:
            if restart[index]:
                run_start = end
            if missing[index]:
                missing_run += 1
                if missing_run > self.max_gap or end - run_start < W:
                    run_start = end  # restart the warm-up: nothing to impute from
                else:
                    if self.stateful is None:
                        guess = self.forecaster.predict(buffer[None, end - W : end])[0, 0]
                    else:
                        assert pending is not None
                        guess = float(pending[0])
                    forecast[index] = guess
                    row = self._imputed_row(values[index], guess, buffer[end - 1])
                    if self.stateful is not None:
                        assert recurrent is not None
                        out, recurrent = self.stateful.step(
                            recurrent, buffer[end - 1 : end], row[None]
                        )
                        pending = out[0]
                    buffer[end] = row
                    imputed_buffer[end] = True
                    imputed[index] = True
                    position[index] = end
                    end += 1
                index += 1
                continue
            # A run of real readings up to the next null or time gap: one batched forecast.
            stop = int(breaks[np.searchsorted(breaks, index, side="right")])
            length = stop - index
            buffer[end : end + length] = values[index:stop]
            positions = np.arange(end, end + length)
            position[index:stop] = positions
            warm = positions - run_start >= W
            if self.stateful is not None:
                continued = end > run_start
                recurrent, pending, made = self._run(
                    buffer[end - 1 if continued else end : end + length],
                    recurrent if continued else None,
                    pending if continued else None,
                    ahead,
                )
                forecast[index:stop][warm] = made[warm]
            elif warm.any():
                targets = positions[warm]
                view = np.lib.stride_tricks.sliding_window_view(buffer, W, axis=0)
                windows = view[targets - W].transpose(0, 2, 1)
                forecast[index:stop][warm] = self.forecaster.predict(windows)[:, 0]
            missing_run = 0
            end += length
            index = stop

        residual = values[:, 0] - forecast  # NaN for nulls and while warming up
        # Monitor input: only residuals of windows made of real readings.
        imputed_before = np.concatenate([[0], np.cumsum(imputed_buffer[:end])])
        monitored = ~np.isnan(residual)
        appended = np.flatnonzero(monitored)
        if appended.size:
            positions = position[appended]
            clean = imputed_before[positions] - imputed_before[positions - W] == 0
            monitored[appended[~clean]] = False
        monitor_residual = np.where(monitored, residual, np.nan)
        warm_reading = ~np.isnan(forecast) & ~imputed
        gaps = None
        if references is not None:
            gaps = np.where(warm_reading, values[:, 0] - references, np.nan)

        run = state.monitor.run(monitor_residual, gaps)

        tail = max(run_start, end - W)
        has_forecast = np.flatnonzero(~np.isnan(forecast))
        if has_forecast.size:
            state.last_forecast = float(forecast[has_forecast[-1]])
        has_residual = np.flatnonzero(~np.isnan(residual))
        if has_residual.size:
            state.last_residual = float(residual[has_residual[-1]])
        for kind, statistics in run.statistics.items():
            known = np.flatnonzero(~np.isnan(statistics))
            if known.size:
                state.last_statistics[kind] = float(statistics[known[-1]])
        first = state.samples
        state.samples += count
        state.window = buffer[tail:end].copy()
        state.imputed = self._marked(imputed_buffer[tail:end].copy())
        state.missing_run = missing_run
        if self.stateful is not None:
            state.recurrent, state.pending = (recurrent, pending) if end > tail else (None, None)
        return BatchResult(
            first_sample=first,
            forecast=forecast,
            residual=residual,
            imputed=imputed,
            monitored=monitored,
            statistics=run.statistics,
            opened=run.opened,
            closed=run.closed,
            open_events=state.monitor.open_events(),
        )

    def _run(
        self,
        readings: np.ndarray,
        recurrent: LSTMState | None,
        pending: np.ndarray | None,
        ahead: RunAhead | None = None,
    ) -> tuple[LSTMState, np.ndarray, np.ndarray]:
        """Step the stateful model over consecutive readings. `readings[0]` is the run's last
        reading so far when `recurrent` is given (its forecast is `pending`), else the first of a
        new run. Returns the state after the last reading, the forecast made then, and the
        forecast of each new reading (NaN for a run's first)."""
        assert self.stateful is not None
        fresh = recurrent is None
        if recurrent is None:
            recurrent = self.stateful.initial_state(1)
            pending = np.full(self.stateful.horizon, np.nan)
        assert pending is not None
        if readings.shape[0] < 2:  # a new run's first reading: nothing to step yet
            return recurrent, pending, np.array([math.nan])
        if ahead is not None and ahead.matches(readings, recurrent):
            out, recurrent = ahead.result
        else:
            out, recurrent = self.stateful.run(readings, recurrent)
        # out[j] is the forecast made after readings[j + 1].
        before = [math.nan, math.nan] if fresh else [float(pending[0])]
        forecasts = np.concatenate([before, out[:-1, 0]])
        return recurrent, out[-1].copy(), forecasts

    def forecast_ahead(self, state: StreamState, horizon: int) -> np.ndarray:
        """The direct multi-step forecast from the current window: (horizon,)."""
        if not 1 <= horizon <= self.forecaster.horizon:
            raise DataError(
                f"horizon must be between 1 and the model's horizon ({self.forecaster.horizon})"
            )
        if remaining := self.warmup_remaining(state):
            raise DataError(
                f"the stream is warming up: {remaining} more readings before it can forecast"
            )
        if self.stateful is not None:
            assert state.pending is not None
            return state.pending[:horizon].copy()
        return self.forecaster.predict(state.window[None])[0, :horizon]
