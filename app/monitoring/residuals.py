"""Residuals r_t = x_t - x_hat_t of a forecaster over a record, forecast in large batches."""

from __future__ import annotations

import numpy as np

from app.forecasting.base import Forecaster, as_2d
from app.forecasting.windows import sliding_windows

BATCH_SIZE = 16384


def one_step_residuals(
    forecaster: Forecaster,
    series: np.ndarray,
    *,
    start: int = 0,
    stop: int | None = None,
    batch_size: int = BATCH_SIZE,
) -> np.ndarray:
    """Residuals of channel 0 for samples [start, stop); NaN where there is no full window.

    The result has the length of `series` so indices stay sample indices. A window holding a
    missing reading (NaN) gives a NaN forecast, hence a NaN residual the monitor skips.
    """
    data = as_2d(series)
    total = data.shape[0]
    stop = total if stop is None else stop
    if not 0 <= start <= stop <= total:
        raise ValueError(f"samples [{start}, {stop}) are not inside the {total}-sample series")
    out = np.full(total, np.nan)
    window = forecaster.window
    for first in range(max(start, window), stop, batch_size):
        targets = np.arange(first, min(first + batch_size, stop))
        forecast = forecaster.predict(sliding_windows(data, targets, window))[:, 0]
        out[targets] = data[targets, 0] - forecast
    return out
