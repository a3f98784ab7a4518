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

The processor is pure: `process` never mutates the state it is given, so a failed database commit
leaves the stream exactly as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.errors import DataError
from app.forecasting.base import Forecaster
from app.monitoring.alarms import AlarmEvent
from app.monitoring.monitor import Monitor, MonitorConfig

STATE_VERSION = 1
DEFAULT_MAX_GAP = 10


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

    def to_json(self) -> dict[str, Any]:
        """Exact (floats round-trip through JSON) and versioned."""
        return {
            "version": STATE_VERSION,
            "samples": self.samples,
            "window": self.window.tolist(),
            "imputed": [bool(x) for x in self.imputed],
            "missing_run": self.missing_run,
            "last_forecast": self.last_forecast,
            "last_residual": self.last_residual,
            "last_statistics": self.last_statistics,
            "monitor": self.monitor.state_dict(),
        }


@dataclass(frozen=True)
class BatchResult:
    """What a batch did, one entry per reading, plus the alarm transitions it caused."""

    first_sample: int
    forecast: np.ndarray  # NaN while warming up
    residual: np.ndarray  # NaN without forecast or reading
    imputed: np.ndarray  # bool: the reading was null and was imputed with its forecast
    monitored: np.ndarray  # bool: the residual reached the detectors
    statistics: dict[str, np.ndarray]  # detector -> statistic (NaN: none)
    opened: list[AlarmEvent]
    closed: list[AlarmEvent]
    open_events: list[AlarmEvent]  # every event open after the batch, with its peak so far


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
        return StreamState(
            samples=int(saved["samples"]),
            window=window,
            imputed=imputed,
            monitor=monitor,
            missing_run=int(saved["missing_run"]),
            last_forecast=saved.get("last_forecast"),
            last_residual=saved.get("last_residual"),
            last_statistics={k: float(v) for k, v in saved.get("last_statistics", {}).items()},
        )

    def warmup_remaining(self, state: StreamState) -> int:
        """Readings still needed before the stream forecasts (and alarms) again."""
        return self.window - int(state.window.shape[0])

    def process(
        self,
        state: StreamState,
        values: np.ndarray,
        references: np.ndarray | None = None,
        restart: np.ndarray | None = None,
    ) -> tuple[StreamState, BatchResult]:
        """Advance `state` by a batch, returning the new state and what happened.

        values: (N, C) readings, NaN for null; references: (N,) reference readings (NaN: none);
        restart: (N,) bool, True where a long time gap precedes the reading.
        """
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 1:
            values = values[:, None]
        count = values.shape[0]
        if values.shape != (count, self.channels):
            raise DataError(
                f"readings have {values.shape[1]} channel(s), the model reads {self.channels}"
            )
        if np.isinf(values).any():
            raise DataError("readings must be finite numbers or null")
        restart = np.zeros(count, dtype=bool) if restart is None else np.asarray(restart, bool)
        W = self.window
        kept = state.window.shape[0]
        buffer = np.empty((kept + count, self.channels))
        buffer[:kept] = state.window
        imputed_buffer = np.zeros(kept + count, dtype=bool)
        imputed_buffer[:kept] = state.imputed
        # Per reading: its position in `buffer` (-1 when it is not appended) and the position
        # where its window's continuous run begins.
        forecast = np.full(count, np.nan)
        imputed = np.zeros(count, dtype=bool)
        position = np.full(count, -1, dtype=np.int64)
        run_start = 0
        end = kept
        missing_run = state.missing_run
        missing = np.isnan(values).any(axis=1)
        index = 0
        while index < count:
            if restart[index]:
                run_start = end
            if missing[index]:
                missing_run += 1
                if missing_run > self.max_gap or end - run_start < W:
                    run_start = end  # restart the warm-up: nothing to impute from
                else:
                    guess = self.forecaster.predict(buffer[None, end - W : end])[0, 0]
                    forecast[index] = guess
                    row = values[index].copy()
                    row[0] = guess if math.isnan(row[0]) else row[0]
                    nan_channels = np.isnan(row)
                    row[nan_channels] = buffer[end - 1, nan_channels]  # carry other channels
                    buffer[end] = row
                    imputed_buffer[end] = True
                    imputed[index] = True
                    position[index] = end
                    end += 1
                index += 1
                continue
            # A run of real readings up to the next null or time gap: one batched forecast.
            stop = index + 1
            while stop < count and not missing[stop] and not restart[stop]:
                stop += 1
            length = stop - index
            buffer[end : end + length] = values[index:stop]
            positions = np.arange(end, end + length)
            position[index:stop] = positions
            warm = positions - run_start >= W
            if warm.any():
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
            references = np.asarray(references, dtype=np.float64)
            if references.shape != (count,):
                raise DataError(f"{references.shape[0]} references for {count} readings")
            if np.isinf(references).any():
                raise DataError("references must be finite numbers or null")
            gaps = np.where(warm_reading, values[:, 0] - references, np.nan)

        monitor = Monitor.from_state(self.monitor_config, state.monitor.state_dict())
        run = monitor.run(monitor_residual, gaps)

        tail = max(run_start, end - W)
        last_forecast = state.last_forecast
        last_residual = state.last_residual
        has_forecast = np.flatnonzero(~np.isnan(forecast))
        if has_forecast.size:
            last_forecast = float(forecast[has_forecast[-1]])
        has_residual = np.flatnonzero(~np.isnan(residual))
        if has_residual.size:
            last_residual = float(residual[has_residual[-1]])
        last_statistics = dict(state.last_statistics)
        for kind, statistics in run.statistics.items():
            known = np.flatnonzero(~np.isnan(statistics))
            if known.size:
                last_statistics[kind] = float(statistics[known[-1]])
        new_state = StreamState(
            samples=state.samples + count,
            window=buffer[tail:end].copy(),
            imputed=imputed_buffer[tail:end].copy(),
            monitor=monitor,
            missing_run=missing_run,
            last_forecast=last_forecast,
            last_residual=last_residual,
            last_statistics=last_statistics,
        )
        result = BatchResult(
            first_sample=state.samples,
            forecast=forecast,
            residual=residual,
            imputed=imputed,
            monitored=monitored,
            statistics=run.statistics,
            opened=run.opened,
            closed=run.closed,
            open_events=monitor.open_events(),
        )
        return new_state, result

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
        return self.forecaster.predict(state.window[None])[0, :horizon]
