"""The stateful LSTM forecaster: one LSTM step per reading, its (h, c) state kept per stream.

Level invariant by construction: the network reads the differenced series
u_t = (x_t - x_{t-1}) / s (s: the TRAINING std of the differences, per channel) and predicts the
change x_{t+k} - x_t in units of s; the change is added to the last reading in float64. The
recurrence carries (h, c) from one reading to the next (the stream's `carry`), so a live stream
costs one step of the 2-layer LSTM per reading instead of re-reading a window. A stream starting
afresh steps once at its first reading, from the zero state and with no change.

`predict(windows)` is that stream started at each window's first reading and read after its
last: W steps from the zero state, the first with a zero change. The trained state forgets its
start within about 200 readings, so with the default window of 256 the offline evaluation scores
what a long-running stream forecasts.

Training (in `networks`, torch) is truncated back-propagation through time over consecutive
chunks of the training stream; epochs are picked on the same validation block as the window
LSTM (`training.split_targets`), scored as `predict` scores.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from app.errors import ArtifactError, DataError
from app.forecasting.graph import STATEFUL_GRAPH, row_blocks
from app.forecasting.neural import NeuralForecaster
from app.forecasting.training import (
    EpochCallback,
    TrainingConfig,
    best_epoch,
    split_targets,
    training_part,
)
from app.forecasting.windows import sliding_windows, target_matrix

if TYPE_CHECKING:
    from app.forecasting.networks import LSTMNetwork, StatefulNetwork

STATEFUL_TRAINING = TrainingConfig(epochs=80, batch_size=4, patience=10)
"""batch_size is B, the number of consecutive chunks (one per batch row) of the stream."""

STATEFUL_WINDOW = 256
"""The warm-up `predict` runs from a zero state (see the module docstring)."""


def difference_scale(data: np.ndarray) -> np.ndarray:
    """(C,) std of the one-step differences of the training part; 1 for a constant channel."""
    std = np.diff(data, axis=0).std(axis=0)
    scale: np.ndarray = np.where(std > 0, std, 1.0).astype(np.float64)
    return scale


class StatefulLSTMForecaster(NeuralForecaster):
    """Its graph maps x (T, B, C), h0 and c0 (layers, B, hidden) to out (T, B, horizon) and the
    final h and c."""

    kind = "lstm-stateful"
    signature = STATEFUL_GRAPH

    diff_std_: np.ndarray  # (C,) training std of each channel's one-step differences

    def __init__(
        self,
        *,
        window: int = STATEFUL_WINDOW,
        horizon: int = 1,
        n_channels: int = 1,
        hidden: int = 32,
        layers: int = 2,
        dropout: float = 0.1,
        sequence: int = 64,
        training: TrainingConfig | None = None,
    ) -> None:
        super().__init__(
            window=window,
            horizon=horizon,
            n_channels=n_channels,
            hidden=hidden,
            layers=layers,
            dropout=dropout,
            training=training or STATEFUL_TRAINING,
        )
        if sequence < 1:
            raise ValueError("sequence must be positive")
        self.sequence = sequence

    def scaling_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"diff_std": (self.n_channels,)}

    def scaling(self) -> dict[str, np.ndarray]:
        return {"diff_std": self.diff_std_}

    def _set_scaling(self, arrays: dict[str, np.ndarray]) -> None:
        if not np.all(arrays["diff_std"] > 0):
            raise ArtifactError("the stored std of the differences must be positive")
        self.diff_std_ = arrays["diff_std"]

    # ---- training ---------------------------------------------------------------------------

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
        data = data[:end]
        config = self.training
        split = split_targets(
            end, window=self.window, horizon=self.horizon, validation=config.validation
        )
        stream_end = int(split.train[-1]) + self.horizon  # one past the last training target
        self.diff_std_ = difference_scale(data[:stream_end])
        validation = None
        if split.validation.size:
            windows = sliding_windows(data, split.validation, self.window)
            future = target_matrix(data[:, 0], split.validation, self.horizon)
            validation = (self._encode_windows(windows), self._scaled_change(future, windows))
        with networks.seeded(config.seed):
            network = self._new_network()
            self.history_ = networks.train_stateful_network(
                network,
                self._stream_examples(data[:stream_end]),
                validation,
                config,
                sequence=self.sequence,
                epochs=config.epochs,
                progress=progress,
                on_epoch=on_epoch,
            )
        self.validation_rmse_ = None
        if validation is not None:
            best = best_epoch(self.history_)
            val_loss = self.history_[best - 1]["val_loss"]
            self.validation_rmse_ = math.sqrt(val_loss) * float(self.diff_std_[0])
            if config.refit:
                # Every target before train_end, the number of epochs chosen above.
                self.diff_std_ = difference_scale(data)
                with networks.seeded(config.seed):
                    network = self._new_network()
                    networks.train_stateful_network(
                        network,
                        self._stream_examples(data),
                        None,
                        config,
                        sequence=self.sequence,
                        epochs=best,
                        progress=progress,
                    )
        self._adopt(network)
        return self

    def _stream_examples(self, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scaled differences (n, C) and the scaled changes (n, horizon) forecast after each.

        Row j reads u_{j+1} = x_{j+1} - x_j; its targets are x_{j+1+k} - x_{j+1}, k = 1..h.
        """
        n = part.shape[0] - 1 - self.horizon
        if n < 1:
            raise DataError("too few training samples for a stateful LSTM")
        inputs = (np.diff(part, axis=0)[:n] / self.diff_std_).astype(np.float32)
        future = target_matrix(part[:, 0], np.arange(2, n + 2), self.horizon)
        change = (future - part[1 : n + 1, 0:1]) / self.diff_std_[0]
        return inputs, change.astype(np.float32)

    def _scaled_change(self, future: np.ndarray, windows: np.ndarray) -> np.ndarray:
        """(B, horizon) future readings -> the network's targets after each window's last."""
        change: np.ndarray = (future - windows[:, -1, 0:1]) / self.diff_std_[0]
        return change

    # ---- forecasting ------------------------------------------------------------------------

    def _encode(self, previous: np.ndarray, current: np.ndarray) -> np.ndarray:
        """(B, T, C) readings and the readings before them -> the network's float32 inputs.
        A NaN previous reading (a stream starting afresh) is a zero change."""
        change = np.where(np.isnan(previous), 0.0, current - previous)
        inputs: np.ndarray = (change / self.diff_std_).astype(np.float32)
        return inputs

    def _encode_windows(self, windows: np.ndarray) -> np.ndarray:
        """The inputs of streams starting afresh at each window's first reading."""
        previous = np.concatenate((np.full_like(windows[:, :1], np.nan), windows[:, :-1]), axis=1)
        return self._encode(previous, windows)

    @property
    def context(self) -> int:
        return 1

    @property
    def carry_size(self) -> int:
        return 2 * self.layers * self.hidden

    def advance(
        self, history: np.ndarray, rows: np.ndarray, carry: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One graph call for the whole block (a bounded number of streams per call when it is
        very large). The carry of a stream is its h then its c, each (layers, hidden),
        flattened."""
        self._check_fitted()
        count, steps = rows.shape[:2]
        if steps == 0:
            return np.empty((count, 0, self.horizon)), carry
        previous = np.concatenate((history[:, -1:], rows[:, :-1]), axis=1)
        inputs = self._encode(previous, rows)
        forecasts = np.empty((count, steps, self.horizon))
        after = np.empty_like(carry)
        for block in row_blocks(count, steps):
            out, after[block] = self._recur(inputs[block], carry[block])
            forecasts[block] = rows[block, :, 0:1] + out.astype(np.float64) * self.diff_std_[0]
        return forecasts, after

    def _recur(self, inputs: np.ndarray, carry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, T, C) float32 inputs and (B, carry_size) carry -> the graph's (B, T, horizon)
        outputs and the carry after the last step."""
        count = inputs.shape[0]
        state = carry.reshape(count, 2, self.layers, self.hidden).transpose(1, 2, 0, 3)
        out, h, c = self.graph_.run(
            x=np.ascontiguousarray(inputs.transpose(1, 0, 2)),
            h0=np.ascontiguousarray(state[0]),
            c0=np.ascontiguousarray(state[1]),
        )
        after = np.stack((h, c)).transpose(2, 0, 1, 3).reshape(count, self.carry_size)
        return out.transpose(1, 0, 2), after

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        self._check_fitted()
        fresh = np.full((windows.shape[0], 1, self.n_channels), np.nan)
        forecasts, _ = self.advance(fresh, windows, self.initial_carry(windows.shape[0]))
        last: np.ndarray = forecasts[:, -1]
        return last

    # ---- torch ------------------------------------------------------------------------------

    def _new_network(self) -> StatefulNetwork:
        from app.forecasting.networks import StatefulNetwork

        return StatefulNetwork(
            n_channels=self.n_channels,
            hidden=self.hidden,
            layers=self.layers,
            dropout=self.dropout,
            horizon=self.horizon,
        )

    def _export(self, network: LSTMNetwork) -> bytes:
        from app.forecasting.networks import StatefulNetwork, export_stateful_graph

        if not isinstance(network, StatefulNetwork):
            raise TypeError("a stateful forecaster exports a StatefulNetwork")
        return export_stateful_graph(network)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "sequence": self.sequence}
