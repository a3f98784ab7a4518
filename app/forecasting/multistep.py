"""Recursive multi-step forecasting: feed a one-step model its own outputs.

Errors compound: each step's forecast error becomes part of the next step's input. The direct
alternative is simply a forecaster built with `horizon=h`.
"""

from __future__ import annotations

import numpy as np

from app.forecasting.base import Forecaster


def recursive_forecast(model: Forecaster, windows: np.ndarray, steps: int) -> np.ndarray:
    """(B, W, 1) windows -> (B, steps): step k forecasts x[i+k] from readings and forecasts.

    Only single-channel one-step models qualify: other channels' future values are unknown,
    and a multi-output model should be used directly instead.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if model.horizon != 1 or model.n_channels != 1:
        raise ValueError(
            "recursive forecasting needs a one-step, single-channel model; "
            f"got horizon {model.horizon} with {model.n_channels} channel(s)"
        )
    buffer = np.array(windows, dtype=np.float64)
    if buffer.ndim != 3 or buffer.shape[1:] != (model.window, 1):
        raise ValueError(f"expected windows of shape (B, {model.window}, 1), got {buffer.shape}")
    forecasts = np.empty((buffer.shape[0], steps))
    for step in range(steps):
        forecasts[:, step] = model.predict(buffer)[:, 0]
        buffer = np.concatenate([buffer[:, 1:], forecasts[:, step, None, None]], axis=1)
    return forecasts
