"""Sliding windows and targets, causal by construction."""

from __future__ import annotations

import numpy as np

from app.forecasting.base import as_2d


def window_starts(first_target: int, stop: int, window: int) -> np.ndarray:
    """Target indices i in [first_target, stop) that have a full window x[i-W:i] before them."""
    return np.arange(max(first_target, window), stop)


def sliding_windows(series: np.ndarray, targets: np.ndarray, window: int) -> np.ndarray:
    """Windows x[i-W:i] for each target index i: shape (len(targets), W, C). A view-free copy."""
    data = as_2d(series)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.size and (targets.min() < window or targets.max() > data.shape[0]):
        raise ValueError("every target needs a full window before it and must lie in the series")
    view = np.lib.stride_tricks.sliding_window_view(data, window, axis=0)  # (T-W+1, C, W)
    return np.ascontiguousarray(view[targets - window].transpose(0, 2, 1))


def target_matrix(values: np.ndarray, targets: np.ndarray, horizon: int) -> np.ndarray:
    """Y[b, j] = values[targets[b] + j]: the `horizon` values each forecast is scored against."""
    values = np.asarray(values, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.size and targets.max() + horizon > values.shape[0]:
        raise ValueError("targets run past the end of the series")
    return values[targets[:, None] + np.arange(horizon)[None, :]]
