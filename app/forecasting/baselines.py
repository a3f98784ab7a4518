"""Baselines every error is printed beside: naive (persistence) and seasonal naive."""

from __future__ import annotations

from typing import Any, Self

import numpy as np

from app.forecasting.base import Forecaster


class Naive(Forecaster):
    """Persistence: x_hat_{t+h} = x_t."""

    kind = "naive"

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        return self

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        return np.repeat(windows[:, -1, 0:1], self.horizon, axis=1)


class SeasonalNaive(Forecaster):
    """x_hat_{t+h} = x_{t+h-m} for h <= m: last period repeated."""

    kind = "seasonal-naive"

    def __init__(
        self, *, period: int = 50, window: int | None = None, horizon: int = 1, n_channels: int = 1
    ) -> None:
        if period < 1:
            raise ValueError("period must be positive")
        if horizon > period:
            raise ValueError(f"seasonal naive forecasts at most one period ahead (h <= {period})")
        super().__init__(window=window or period, horizon=horizon, n_channels=n_channels)
        if self.window < period:
            raise ValueError(f"the window ({self.window}) must hold one period ({period})")
        self.period = period

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        return self

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        # Position of x_{t+h-m} in a window whose last element is x_t: W-1+h-m.
        positions = self.window - 1 - self.period + np.arange(1, self.horizon + 1)
        return windows[:, positions, 0]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "period": self.period}
