"""The stateful LSTM a learning stream may earn: the one candidate that needs torch.

A stream of one channel that learns from at least `LSTM_MIN_READINGS` readings, on an install
with torch (the `train` extra), also trains the stateful LSTM the built-in twin's model is
(`app/forecasting/stateful_lstm.py`): on the same first three quarters of its learning readings
as its linear candidates (at most the last `LSTM_MAX_READINGS` of them), scored on the same
held-out last quarter. It replaces the chosen linear model only when clearly better there: a
hold-out mean squared error at most `LSTM_CLEARLY_BETTER` times the linear model's. A network
costs more to run and is harder to explain; a non-linear machine (a stiffening mount, a
pump near cavitation) forecast well enough earns it, because a forecast that misses less
leaves a fault's change in the residuals more visible.

It is kept as it was trained (not refitted on the whole learning period): the hold-out it was
chosen on is then honest, and its residuals there set the thresholds as a linear model's do.
Pure but for torch's training: no I/O.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np

from app.errors import AppError, DataError
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig

LSTM_MIN_READINGS = 10_000
"""Learning readings before an LSTM is worth training: its hold-out (a quarter) then holds
2,500 readings, enough to tell a clearly better forecast from luck; fewer readings rarely
train a network that beats a linear model."""
LSTM_MAX_READINGS = 60_000
"""The latest training readings the network trains on: a longer learning period adds little
to the fit and only lengthens the training, while the stream is still learning."""
LSTM_CLEARLY_BETTER = 0.8
"""The network's hold-out mean squared error must be at most 0.8 x the linear model's."""
LSTM_TRAINING = TrainingConfig(epochs=30, batch_size=4, patience=5, validation=500, seed=0)
"""The twin's stateful recipe, shortened: at most 30 epochs, stopped after 5 without a better
validation loss (the last 500 training readings)."""


@dataclass(frozen=True)
class NetworkCandidate:
    """What became of a stream's LSTM candidate: the trained network (None if it was not
    trained), its hold-out RMSE and why it was or was not chosen."""

    network: StatefulLSTMForecaster | None
    validation_rmse: float
    note: str


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def not_tried(count: int, channels: int, *, wanted: bool) -> str | None:
    """Why a stream's learning readings get no LSTM candidate (None: they do)."""
    if channels != 1:
        return "not tried: the LSTM candidate forecasts streams of one channel"
    if count < LSTM_MIN_READINGS:
        return f"not tried: fewer than {LSTM_MIN_READINGS:,} learning readings"
    if not wanted:
        return (
            "not tried: switched off (TWINWATCH_LEARNING_LSTM; in a relearning: "
            "TWINWATCH_RELEARNING_LSTM)"
        )
    if not torch_available():
        return "not tried: torch is not installed (pip install 'twinwatch[train]')"
    return None


def train_network(values: np.ndarray) -> StatefulLSTMForecaster:
    """The stateful LSTM trained on the last `LSTM_MAX_READINGS` of one channel's training
    readings (nulls carried forward from the last reading)."""
    series = _carried_forward(values[-LSTM_MAX_READINGS:, :1])
    network = StatefulLSTMForecaster(n_channels=1, training=LSTM_TRAINING)
    return network.fit(series)


def judge(
    network: StatefulLSTMForecaster, network_mse: float, linear_mse: float
) -> NetworkCandidate:
    """Keep the network if its hold-out error is clearly below the linear model's."""
    rmse, linear = float(np.sqrt(network_mse)), float(np.sqrt(linear_mse))
    versus = f"hold-out RMSE {rmse:.4g} against the linear model's {linear:.4g}"
    if network_mse <= LSTM_CLEARLY_BETTER * linear_mse:
        return NetworkCandidate(network, rmse, f"chosen: {versus}")
    return NetworkCandidate(None, rmse, f"not chosen: {versus}")


def failed(exc: AppError) -> NetworkCandidate:
    return NetworkCandidate(None, float("nan"), f"not chosen: its training failed: {exc.detail}")


def _carried_forward(values: np.ndarray) -> np.ndarray:
    """Each null replaced by the last reading before it (the first reading after it, at the
    start)."""
    finite = ~np.isnan(values[:, 0])
    if not finite.any():
        raise DataError("the LSTM's training readings hold no number")
    index = np.where(finite, np.arange(values.shape[0]), 0)
    np.maximum.accumulate(index, out=index)
    index[: int(np.argmax(finite))] = int(np.argmax(finite))
    return values[index]
