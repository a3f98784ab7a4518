"""The LSTM forecaster of SPEC section 2, per-window normalised (and the global failure case).

per_window: inputs z-scored with TRAINING statistics, last = x[:, -1:, :],
out = lstm(x - last), y = head(out[:, -1]) + last[:, 0]. The network only ever sees changes
from the window's last reading, so a drifting level never leaves its training range.
global: plain z-score, no subtraction; kept (kind "lstm-global") to show why that fails.
The scaling lives in `normalisation`, the loop in `training`.
"""

from __future__ import annotations

import math
from typing import Any, Self

import numpy as np
import torch
from torch import nn

from app.forecasting.base import Forecaster
from app.forecasting.normalisation import (
    NORMALISATIONS,
    Normalisation,
    decode_outputs,
    encode_inputs,
    encode_targets,
    training_statistics,
)
from app.forecasting.training import (
    EpochCallback,
    TrainingConfig,
    best_epoch,
    forward_in_chunks,
    parameter_count,
    seeded,
    split_targets,
    train_network,
    training_part,
)
from app.forecasting.windows import sliding_windows, target_matrix

FORGET_GATE_BIAS = 1.0


class LSTMNetwork(nn.Module):
    """Stacked LSTM read at its last step, then a linear head with one output per horizon."""

    def __init__(
        self, *, n_channels: int, hidden: int, layers: int, dropout: float, horizon: int
    ) -> None:
        super().__init__()
        # nn.LSTM applies dropout between layers only, never on the output of the last one.
        self.lstm = nn.LSTM(
            n_channels,
            hidden,
            num_layers=layers,
            dropout=dropout if layers > 1 else 0.0,
            batch_first=True,
        )
        self.head = nn.Linear(hidden, horizon)
        self._init_forget_gates()

    def _init_forget_gates(self) -> None:
        """Start the forget gates open so early gradients flow through the whole window.
        PyTorch orders the gate biases (input, forget, cell, output)."""
        hidden = self.lstm.hidden_size
        with torch.no_grad():
            for name, bias in self.lstm.named_parameters():
                if name.startswith("bias_ih"):
                    bias[hidden : 2 * hidden].fill_(FORGET_GATE_BIAS)
                elif name.startswith("bias_hh"):
                    bias[hidden : 2 * hidden].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        result: torch.Tensor = self.head(out[:, -1])
        return result


class LSTMForecaster(Forecaster):
    """`LSTMForecaster(normalisation="global")` builds the failure case, whose kind is
    "lstm-global": the two are different models on disk and in every report."""

    kind = "lstm"

    mean_: np.ndarray  # (C,) training mean per channel
    std_: np.ndarray  # (C,) training std per channel
    module_: LSTMNetwork
    history_: list[dict[str, float]]
    validation_rmse_: float | None  # best-epoch validation RMSE in reading units

    def __new__(cls, *args: Any, **kwargs: Any) -> LSTMForecaster:
        target = cls
        if cls is LSTMForecaster and kwargs.get("normalisation") == "global":
            target = GlobalLSTMForecaster
        instance: LSTMForecaster = super().__new__(target)
        return instance

    def __init__(
        self,
        *,
        window: int = 64,
        horizon: int = 1,
        n_channels: int = 1,
        hidden: int = 32,
        layers: int = 2,
        dropout: float = 0.1,
        normalisation: Normalisation = "per_window",
        training: TrainingConfig | None = None,
    ) -> None:
        super().__init__(window=window, horizon=horizon, n_channels=n_channels)
        if normalisation not in NORMALISATIONS:
            raise ValueError(
                f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}"
            )
        if (normalisation == "global") != (self.kind == "lstm-global"):
            raise ValueError(f"{type(self).__name__} cannot use {normalisation!r} normalisation")
        if hidden < 1 or layers < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError("hidden and layers must be positive, dropout in [0, 1)")
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.normalisation: Normalisation = normalisation
        self.training = training or TrainingConfig()

    def build_network(self) -> LSTMNetwork:
        """A freshly initialised network of this configuration (seed torch first)."""
        return LSTMNetwork(
            n_channels=self.n_channels,
            hidden=self.hidden,
            layers=self.layers,
            dropout=self.dropout,
            horizon=self.horizon,
        )

    @property
    def n_parameters(self) -> int:
        return parameter_count(self.build_network)

    def fit(
        self,
        series: np.ndarray,
        *,
        train_end: int | None = None,
        progress: bool = False,
        on_epoch: EpochCallback | None = None,
    ) -> Self:
        data, end = training_part(series, train_end, n_channels=self.n_channels)
        data = data[:end]  # nothing after train_end is even in scope from here on
        config = self.training
        split = split_targets(
            end, window=self.window, horizon=self.horizon, validation=config.validation
        )
        self.mean_, self.std_ = training_statistics(data)
        validation = self._examples(data, split.validation) if split.validation.size else None
        with seeded(config.seed):
            self.module_ = self.build_network()
            self.history_ = train_network(
                self.module_,
                self._examples(data, split.train),
                validation,
                config,
                progress=progress,
                on_epoch=on_epoch,
            )
        self.validation_rmse_ = None
        if validation is None:
            return self
        best = best_epoch(self.history_)
        self.validation_rmse_ = math.sqrt(self.history_[best - 1]["val_loss"]) * float(self.std_[0])
        if config.refit:
            # Same seed, every window of the training period, the epoch count chosen above.
            everything = split_targets(end, window=self.window, horizon=self.horizon, validation=0)
            with seeded(config.seed):
                self.module_ = self.build_network()
                train_network(
                    self.module_,
                    self._examples(data, everything.train),
                    None,
                    config,
                    epochs=best,
                    progress=progress,
                )
        return self

    def _examples(self, data: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Encoded (inputs, targets) for the forecast origins `targets`."""
        windows = sliding_windows(data, targets, self.window)
        future = target_matrix(data[:, 0], targets, self.horizon)
        return (
            encode_inputs(windows, self.mean_, self.std_, self.normalisation),
            encode_targets(future, windows, self.mean_, self.std_, self.normalisation),
        )

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        if not hasattr(self, "module_"):
            raise RuntimeError(f"{self.kind} must be fitted (or loaded) before predicting")
        inputs = encode_inputs(windows, self.mean_, self.std_, self.normalisation)
        outputs = forward_in_chunks(self.module_, inputs)
        return decode_outputs(outputs, windows, self.mean_, self.std_, self.normalisation)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "hidden": self.hidden,
            "layers": self.layers,
            "dropout": self.dropout,
            "normalisation": self.normalisation,
            "training": self.training.to_dict(),
        }


class GlobalLSTMForecaster(LSTMForecaster):
    """Globally z-scored LSTM: saturates outside its training range (SPEC section 2)."""

    kind = "lstm-global"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("normalisation", "global")
        super().__init__(**kwargs)
