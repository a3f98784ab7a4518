"""The LSTM forecaster, per-window normalised (and the global failure case).

per_window: inputs z-scored with TRAINING statistics, last = x[:, -1:, :],
out = lstm(x - last), y = head(out[:, -1]) + last[:, 0]. The network only ever sees changes
from the window's last reading, so a drifting level never leaves its training range.
global: plain z-score, no subtraction; kept (`GlobalLSTMForecaster`, kind "lstm-global") to
show why that fails. The scaling lives in `normalisation` (float64, around the graph), the
network and its training loop in `networks` (torch, imported by `fit` only).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from app.errors import ArtifactError
from app.forecasting.graph import WINDOW_GRAPH, row_blocks
from app.forecasting.neural import NeuralForecaster
from app.forecasting.normalisation import (
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
    split_targets,
    training_part,
)
from app.forecasting.windows import sliding_windows, target_matrix

if TYPE_CHECKING:
    from app.forecasting.networks import LSTMNetwork


class LSTMForecaster(NeuralForecaster):
    """Reads each window afresh: its graph maps x (B, W, C) to out (B, horizon)."""

    kind = "lstm"
    normalisation: ClassVar[Normalisation] = "per_window"
    signature = WINDOW_GRAPH

    mean_: np.ndarray  # (C,) training mean per channel
    std_: np.ndarray  # (C,) training std per channel

    def __init__(
        self,
        *,
        window: int = 64,
        horizon: int = 1,
        n_channels: int = 1,
        hidden: int = 32,
        layers: int = 2,
        dropout: float = 0.1,
        training: TrainingConfig | None = None,
    ) -> None:
        super().__init__(
            window=window,
            horizon=horizon,
            n_channels=n_channels,
            hidden=hidden,
            layers=layers,
            dropout=dropout,
            training=training or TrainingConfig(),
        )

    def scaling_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"mean": (self.n_channels,), "std": (self.n_channels,)}

    def scaling(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean_, "std": self.std_}

    def _set_scaling(self, arrays: dict[str, np.ndarray]) -> None:
        if not np.all(arrays["std"] > 0):
            raise ArtifactError("the stored training std must be positive")
        self.mean_, self.std_ = arrays["mean"], arrays["std"]

    def fit(
        self,
        series: np.ndarray,
        *,
        train_end: int | None = None,
        progress: bool = False,
        on_epoch: EpochCallback | None = None,
    ) -> Self:
        self._require_torch()
        from app.forecasting import networks

        data, end = training_part(series, train_end, n_channels=self.n_channels)
        data = data[:end]  # nothing after train_end is even in scope from here on
        config = self.training
        split = split_targets(
            end, window=self.window, horizon=self.horizon, validation=config.validation
        )
        self.mean_, self.std_ = training_statistics(data)
        validation = self._examples(data, split.validation) if split.validation.size else None
        with networks.seeded(config.seed):
            network = self._new_network()
            self.history_ = networks.train_window_network(
                network,
                self._examples(data, split.train),
                validation,
                config,
                epochs=config.epochs,
                progress=progress,
                on_epoch=on_epoch,
            )
        self.validation_rmse_ = None
        if validation is not None:
            best = best_epoch(self.history_)
            val_loss = self.history_[best - 1]["val_loss"]
            self.validation_rmse_ = math.sqrt(val_loss) * float(self.std_[0])
            if config.refit:
                # Same seed, every window of the training period, the epoch count chosen above.
                everything = split_targets(
                    end, window=self.window, horizon=self.horizon, validation=0
                )
                with networks.seeded(config.seed):
                    network = self._new_network()
                    networks.train_window_network(
                        network,
                        self._examples(data, everything.train),
                        None,
                        config,
                        epochs=best,
                        progress=progress,
                    )
        self._adopt(network)
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
        self._check_fitted()
        inputs = encode_inputs(windows, self.mean_, self.std_, self.normalisation)
        outputs = np.concatenate(
            [
                self.graph_.run(x=inputs[block])[0]
                for block in row_blocks(inputs.shape[0], self.window)
            ]
        )
        return decode_outputs(outputs, windows, self.mean_, self.std_, self.normalisation)

    def _new_network(self) -> LSTMNetwork:
        from app.forecasting.networks import LSTMNetwork

        return LSTMNetwork(
            n_channels=self.n_channels,
            hidden=self.hidden,
            layers=self.layers,
            dropout=self.dropout,
            horizon=self.horizon,
        )

    def _export(self, network: LSTMNetwork) -> bytes:
        from app.forecasting.networks import export_window_graph

        return export_window_graph(network)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "normalisation": self.normalisation}


class GlobalLSTMForecaster(LSTMForecaster):
    """Globally z-scored LSTM: saturates outside its training range."""

    kind = "lstm-global"
    normalisation = "global"
