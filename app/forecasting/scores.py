"""Forecast error measures (RMSE, MAE, mean error, MASE), in the units of the series.

Every score compares `forecast` with `actual` of the same shape: (n,) for one-step forecasts or
(n, h) for multi-step ones. The per-step variants keep the horizon axis so that error against
horizon comes from the same formula as the overall figure.
"""

from __future__ import annotations

import numpy as np

from app.errors import DataError


def _errors(forecast: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """forecast - actual, refusing shapes that would silently broadcast or empty inputs."""
    forecast = np.asarray(forecast, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if forecast.shape != actual.shape:
        raise ValueError(f"forecast {forecast.shape} and actual {actual.shape} differ in shape")
    if forecast.size == 0:
        raise ValueError("nothing to score: no forecasts")
    errors: np.ndarray = forecast - actual
    return errors


def rmse_per_step(forecast: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """RMSE of each horizon step: (n, h) -> (h,). A (n,) input counts as one step."""
    errors = _errors(forecast, actual)
    if errors.ndim == 1:
        errors = errors[:, None]
    result: np.ndarray = np.sqrt(np.mean(errors**2, axis=0))
    return result


def rmse(forecast: np.ndarray, actual: np.ndarray) -> float:
    """Root mean squared error over every forecast and step."""
    return float(np.sqrt(np.mean(_errors(forecast, actual) ** 2)))


def mae(forecast: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute error over every forecast and step."""
    return float(np.mean(np.abs(_errors(forecast, actual))))


def mean_error(forecast: np.ndarray, actual: np.ndarray) -> float:
    """Bias, mean(forecast - actual): negative when the forecaster reads low."""
    return float(np.mean(_errors(forecast, actual)))


def naive_scale(train_values: np.ndarray) -> float:
    """In-sample MAE of the one-step naive forecast on the training values: MASE's denominator.

    Taken on the training part only, so the scale is known when the forecaster is fitted.
    """
    values = np.asarray(train_values, dtype=np.float64)
    if values.ndim != 1 or values.shape[0] < 2:
        raise ValueError("the naive scale needs at least two training values")
    scale = float(np.mean(np.abs(np.diff(values))))
    if not np.isfinite(scale):
        raise DataError("the training values contain NaN or infinity: MASE is undefined")
    if scale == 0.0:
        raise DataError("the training values are constant: MASE is undefined")
    return scale


def mase(forecast: np.ndarray, actual: np.ndarray, *, train_values: np.ndarray) -> float:
    """MAE / naive_scale(train_values): below 1 beats the in-sample naive forecast."""
    return mae(forecast, actual) / naive_scale(train_values)
