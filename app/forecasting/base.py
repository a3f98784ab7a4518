"""The one interface every forecaster implements.

A forecaster maps windows of past readings, shape (B, W, C) with channel 0 the sensor being
forecast and channels 1.. other sensors or known exogenous inputs, to the next `horizon` values
of channel 0, shape (B, horizon). Row b of the output for window x[i-W:i] is the forecast of
x[i], x[i+1], ..., x[i+horizon-1]. A forecaster of several sensors at once (`targets` > 1:
channels 0 .. targets - 1 are forecast) gives `horizon * targets` outputs a window, step after
step: the first `targets` are the next reading of each.

Two ways to ask, one arithmetic:

- `predict(windows)`: offline (walk-forward evaluation), any windows;
- `advance(history, rows, carry)`: streaming (the stream recurrence in `app/streams`): the
  forecasts made after each of a block of new readings of many streams, carrying whatever the
  forecaster keeps between readings (`carry`: one float32 row per stream, empty for a
  forecaster that re-reads its window, the recurrent state (h, c) for a stateful one).

A window forecaster's `advance` is `predict` over the windows ending at each new row, so a live
stream forecasts exactly what the offline evaluation scores. Results never depend on how streams
and readings are grouped into blocks: the recurrence's replay after a crash relies on it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np


class Forecaster(ABC):
    kind: ClassVar[str]

    def __init__(self, *, window: int, horizon: int = 1, n_channels: int = 1) -> None:
        if window < 1 or horizon < 1 or n_channels < 1:
            raise ValueError("window, horizon and n_channels must be positive")
        self.window = window
        self.horizon = horizon
        self.n_channels = n_channels

    @abstractmethod
    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        """Learn from `series[:train_end]` only (shape (T, C)); nothing after it is read."""

    @property
    def targets(self) -> int:
        """How many channels it forecasts (the first ones)."""
        return 1

    @property
    def outputs(self) -> int:
        """Numbers forecast after each reading: `horizon` steps of each target, step after step."""
        return self.horizon * self.targets

    def predict(self, windows: np.ndarray) -> np.ndarray:
        """Validate the shape, then forecast: (B, W, C) -> (B, outputs) float64."""
        # C order whatever the caller's layout: numpy sums a row of a C-ordered array the same
        # way for any number of rows, and a row strided across others in another order.
        windows = np.ascontiguousarray(windows, dtype=np.float64)
        if windows.ndim != 3 or windows.shape[1:] != (self.window, self.n_channels):
            raise ValueError(
                f"{self.kind} expects windows of shape (B, {self.window}, {self.n_channels}), "
                f"got {windows.shape}"
            )
        if windows.shape[0] == 0:
            return np.empty((0, self.outputs))
        return self._predict(windows)

    @abstractmethod
    def _predict(self, windows: np.ndarray) -> np.ndarray: ...

    # -- streaming --

    @property
    def context(self) -> int:
        """How many of a stream's latest readings `advance` reads besides the new ones."""
        return self.window

    @property
    def carry_size(self) -> int:
        """Floats a stream carries between readings besides its readings (see `advance`)."""
        return 0

    def initial_carry(self, streams: int) -> np.ndarray:
        """The carry of `streams` streams starting afresh: (streams, carry_size) float32."""
        return np.zeros((streams, self.carry_size), dtype=np.float32)

    def advance(
        self, history: np.ndarray, rows: np.ndarray, carry: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The forecasts made after each of `rows`, and the carry after the last.

        history: (B, context, C) float64, each stream's latest readings before `rows`, oldest
        first; NaN where a stream that starts afresh has none. rows: (B, T, C) float64, finite.
        carry: (B, carry_size) float32 after the last reading of `history`.
        Returns (B, T, outputs) float64, row [b, t] the forecast of the readings after
        rows[b, t] (NaN while the window before it is incomplete), and the new carry. Pure.
        """
        count, steps = rows.shape[:2]
        if steps == 0:
            return np.empty((count, 0, self.outputs)), carry
        extended = np.concatenate((history, rows), axis=1)  # (B, W + T, C)
        # The window after rows[:, t] is extended[:, t + 1 : t + 1 + W].
        positions = np.arange(1, steps + 1)[:, None] + np.arange(self.window)
        windows = extended[:, positions].reshape(-1, self.window, self.n_channels)
        forecast = self.predict(windows).reshape(count, steps, self.outputs)
        return forecast, carry

    def spread_growth(self, steps: int) -> np.ndarray | None:
        """How much wider, per target, the error of a forecast `steps` readings ahead (the
        readings between fed its own forecasts) is than a one-step forecast's: what the stream
        recurrence divides a residual by while it holds alarmed readings out of the history.
        None: this forecaster cannot say, and a stream of it holds nothing out."""
        return None

    def config(self) -> dict[str, Any]:
        """What a manifest needs to rebuild this forecaster (weights aside)."""
        return {
            "kind": self.kind,
            "window": self.window,
            "horizon": self.horizon,
            "n_channels": self.n_channels,
        }


def as_2d(series: np.ndarray) -> np.ndarray:
    """Accept (T,) or (T, C); return (T, C) float64."""
    array = np.asarray(series, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"a series is (T,) or (T, C), got shape {array.shape}")
    return array
