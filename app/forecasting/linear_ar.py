"""Linear autoregression, direct multi-step.

Least squares on each channel's window minus its own last value, plus an intercept; the target
is channel 0's future minus its last value; one output column per horizon step. Working on
differences from the last value makes the model blind to the level, so a drifting level costs
nothing (the same reason the LSTM subtracts it).
"""

from __future__ import annotations

from typing import Self

import numpy as np

from app.forecasting.base import Forecaster
from app.forecasting.training import single_threaded, split_targets, training_part
from app.forecasting.windows import sliding_windows, target_matrix


def _features(windows: np.ndarray) -> np.ndarray:
    """(B, W, C) -> (B, (W-1)*C): every reading but the last, minus its channel's last reading.
    The last position is identically zero, so it is left out of the design matrix."""
    deviations: np.ndarray = windows[:, :-1, :] - windows[:, -1:, :]
    return deviations.reshape(windows.shape[0], -1)


class LinearAR(Forecaster):
    kind = "linear-ar"

    coef_: np.ndarray  # (W, C, horizon); row W-1 is zero (the last value minus itself)
    intercept_: np.ndarray  # (horizon,)

    def __init__(self, *, window: int = 64, horizon: int = 1, n_channels: int = 1) -> None:
        super().__init__(window=window, horizon=horizon, n_channels=n_channels)

    def fit(self, series: np.ndarray, *, train_end: int | None = None) -> Self:
        data, end = training_part(series, train_end, n_channels=self.n_channels)
        targets = split_targets(end, window=self.window, horizon=self.horizon, validation=0).train
        windows = sliding_windows(data[:end], targets, self.window)
        change = target_matrix(data[:end, 0], targets, self.horizon) - windows[:, -1, 0:1]
        design = np.hstack([_features(windows), np.ones((windows.shape[0], 1))])
        with single_threaded():
            solution, *_ = np.linalg.lstsq(design, change, rcond=None)
        coef = np.zeros((self.window, self.n_channels, self.horizon))
        coef[:-1] = solution[:-1].reshape(self.window - 1, self.n_channels, self.horizon)
        self.coef_ = coef
        self.intercept_ = solution[-1].copy()
        return self

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        """Each horizon column an elementwise product summed along the features, not a matrix
        product: BLAS blocks a product differently for different batch sizes, and a stream's
        forecast must not depend on which streams share its call (see `base`)."""
        if not hasattr(self, "coef_"):
            raise RuntimeError(f"{self.kind} must be fitted (or loaded) before predicting")
        features = _features(windows)  # (B, F), C-contiguous: each row summed on its own
        columns = np.ascontiguousarray(self.coef_[:-1].reshape(-1, self.horizon).T)  # (H, F)
        change = np.stack([(features * column).sum(axis=1) for column in columns], axis=1)
        forecast: np.ndarray = windows[:, -1, 0:1] + (change + self.intercept_)
        return forecast
