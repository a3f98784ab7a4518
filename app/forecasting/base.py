"""The one interface every forecaster implements.

A forecaster maps windows of past readings, shape (B, W, C) with channel 0 the sensor being
forecast and channels 1.. other sensors or known exogenous inputs, to the next `horizon` values
of channel 0, shape (B, horizon). Row b of the output for window x[i-W:i] is the forecast of
x[i], x[i+1], ..., x[i+horizon-1]. Windows are the only input, so the offline evaluation and the
live stream engine call exactly the same code.
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

    def predict(self, windows: np.ndarray) -> np.ndarray:
        """Validate the shape, then forecast: (B, W, C) -> (B, horizon) float64."""
        windows = np.asarray(windows, dtype=np.float64)
        if windows.ndim != 3 or windows.shape[1:] != (self.window, self.n_channels):
            raise ValueError(
                f"{self.kind} expects windows of shape (B, {self.window}, {self.n_channels}), "
                f"got {windows.shape}"
            )
        if windows.shape[0] == 0:
            return np.empty((0, self.horizon))
        return self._predict(windows)

    @abstractmethod
    def _predict(self, windows: np.ndarray) -> np.ndarray: ...

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
