"""The stateful LSTM forecaster (SPEC sections 2 and 6): one LSTM step per reading.

Level invariant by construction: the network reads the differenced series
u_t = (x_t - x_{t-1}) / s (s: the TRAINING std of the differences, per channel) and predicts the
change x_{t+k} - x_t in units of s; the change is added to the last reading in float64. The
recurrence carries (h, c) from one reading to the next, so a live stream costs one step of the
2-layer LSTM per reading instead of re-reading a 64-sample window.

Training is truncated back-propagation through time: the training stream is cut into B
consecutive chunks (chunk i always in batch row i), read `sequence` steps at a time, the state
carried across sequence boundaries and detached at each one. Epochs are picked on the same
validation block as the window LSTM (`training.split_targets`), scored as `predict` scores.

Two ways to run it, each one implementation:

- `predict(windows)`: the `Forecaster` interface, the recurrence over each window from a zero
  state (a warm-up of W - 1 differences), for the walk-forward evaluation;
- `initial_state` / `step` / `run`: the streaming interface, vectorised over streams (batch
  row = stream), with `state_to_json` / `state_from_json` for checkpoints (exact round trip).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from app.errors import ArtifactError, DataError
from app.forecasting.base import Forecaster, as_2d
from app.forecasting.lstm import LSTMNetwork
from app.forecasting.onnx_lstm import OnnxLSTM
from app.forecasting.training import (
    EpochCallback,
    TrainingConfig,
    best_epoch,
    clipped_step,
    epoch_record,
    parameter_count,
    seeded,
    single_threaded,
    split_targets,
    training_part,
)
from app.forecasting.windows import sliding_windows, target_matrix

STATEFUL_TRAINING = TrainingConfig(epochs=80, batch_size=4, patience=10)
"""batch_size is B, the number of consecutive chunks (one per batch row) of the stream."""

STATEFUL_WINDOW = 256
"""The warm-up `predict` runs from a zero state. The trained state forgets its start within
about 200 readings: on the twin (origin 6000) windows of 64, 128 and 256 readings forecast
within 3.6e-2, 1.5e-3 and 4e-7 of the stream stepped from its first reading, so with 256 the
offline evaluation scores what the live stream forecasts."""

PREDICT_CHUNK = 4096
NUMPY_STEP_LIMIT = 32
"""Below this many streams a step runs in numpy (`NumpyLSTM`): in the service, between a
request's other work, one stream's step took as long through ONNX Runtime (13 us in a tight
loop, 36 between requests' work) and a single-reading request was 40 us slower with it."""
ONNX_STEP_LIMIT = 600
"""Below this many streams (and from NUMPY_STEP_LIMIT on) a step runs through ONNX Runtime
(`OnnxLSTM`: 57 us for 128 streams, against 120 through torch's LSTM cell); at 512 the two
are even, and at 1,000 nn.LSTM's fused step is 15% faster. Measured on this project's 2-core
CPU, torch 2.13, hidden 32."""
STATE_FORMAT = 1

TorchState = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True)  # not frozen: one per stream and reading, a frozen init costs 2x
class LSTMState:
    """(h, c) of every stream: each (layers, streams, hidden) float32. Row i of the batch axis
    is stream i; `select` and `stack` regroup streams for cross-stream batching."""

    h: np.ndarray
    c: np.ndarray

    @property
    def streams(self) -> int:
        return int(self.h.shape[1])

    def select(self, rows: np.ndarray | list[int]) -> LSTMState:
        index = np.asarray(rows, dtype=np.int64)
        return LSTMState(h=self.h[:, index].copy(), c=self.c[:, index].copy())

    @staticmethod
    def stack(states: list[LSTMState]) -> LSTMState:
        """Streams of several states side by side, in the order given."""
        return LSTMState(
            h=np.concatenate([s.h for s in states], axis=1),
            c=np.concatenate([s.c for s in states], axis=1),
        )


def state_to_json(state: LSTMState) -> dict[str, Any]:
    """Plain JSON. float32 -> Python float is exact, and so is the way back."""
    return {
        "format": STATE_FORMAT,
        "shape": list(state.h.shape),
        "h": state.h.astype(np.float64).ravel().tolist(),
        "c": state.c.astype(np.float64).ravel().tolist(),
    }


def state_from_json(payload: Any) -> LSTMState:
    """Inverse of `state_to_json`; a malformed checkpoint is an ArtifactError."""
    try:
        if payload["format"] != STATE_FORMAT:
            raise ArtifactError(f"unknown LSTM state format {payload['format']!r}")
        shape = tuple(int(v) for v in payload["shape"])
        if len(shape) != 3:
            raise ArtifactError(f"an LSTM state is (layers, streams, hidden), got {shape}")
        h = np.asarray(payload["h"], dtype=np.float64).astype(np.float32).reshape(shape)
        c = np.asarray(payload["c"], dtype=np.float64).astype(np.float32).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"not a valid LSTM state: {exc!r}") from exc
    if not (np.isfinite(h).all() and np.isfinite(c).all()):
        raise ArtifactError("an LSTM state must be finite")
    return LSTMState(h=h, c=c)


def difference_scale(data: np.ndarray) -> np.ndarray:
    """(C,) std of the one-step differences of the training part; 1 for a constant channel."""
    std = np.diff(data, axis=0).std(axis=0)
    scale: np.ndarray = np.where(std > 0, std, 1.0).astype(np.float64)
    return scale


class StatefulNetwork(LSTMNetwork):
    """The window LSTM's architecture (same parameters and names), read at every step."""

    def sequence(
        self, x: torch.Tensor, state: TorchState | None = None
    ) -> tuple[torch.Tensor, TorchState]:
        """(B, T, C) inputs -> ((B, T, horizon) outputs, final (h, c))."""
        out, (h, c) = self.lstm(x, state)
        result: torch.Tensor = self.head(out)
        return result, (h, c)

    def step(self, x: torch.Tensor, state: TorchState) -> tuple[torch.Tensor, TorchState]:
        """(B, C) inputs of one time step -> ((B, horizon) outputs, next (h, c))."""
        out, next_state = self.sequence(x[:, None, :], state)
        return out[:, 0], next_state


@dataclass(frozen=True)
class NumpyLSTM:
    """`StatefulNetwork.step` in numpy float32, for a few streams (see `NUMPY_STEP_LIMIT`):
    the same gate equations on a copy of `module`'s weights, taken for inference."""

    module: StatefulNetwork
    layers: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    head: tuple[np.ndarray, np.ndarray]

    @classmethod
    def of(cls, module: StatefulNetwork) -> NumpyLSTM:
        def weight(name: str) -> np.ndarray:
            return np.array(getattr(module.lstm, name).detach().numpy())

        layers = tuple(
            (
                np.ascontiguousarray(weight(f"weight_ih_l{layer}").T),
                np.ascontiguousarray(weight(f"weight_hh_l{layer}").T),
                weight(f"bias_ih_l{layer}"),
                weight(f"bias_hh_l{layer}"),
            )
            for layer in range(module.lstm.num_layers)
        )
        head_weight = np.ascontiguousarray(module.head.weight.detach().numpy().T)
        return cls(module, layers, (head_weight, module.head.bias.detach().numpy().copy()))

    def step(
        self, x: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, C) float32 inputs, (layers, B, hidden) state -> (B, horizon) outputs, next h, c.
        PyTorch orders the gates (input, forget, cell, output)."""
        hidden = h.shape[2]
        hs, cs = [], []
        for layer, (w_ih, w_hh, b_ih, b_hh) in enumerate(self.layers):
            gates = (x @ w_ih + b_ih) + (h[layer] @ w_hh + b_hh)
            sigmoid = 0.5 + 0.5 * np.tanh(0.5 * gates)  # (1 / (1 + exp(-x)) overflows)
            cell = np.tanh(gates[:, 2 * hidden : 3 * hidden])
            c_layer = sigmoid[:, hidden : 2 * hidden] * c[layer] + sigmoid[:, :hidden] * cell
            x = sigmoid[:, 3 * hidden :] * np.tanh(c_layer)
            hs.append(x)
            cs.append(c_layer)
        weight, bias = self.head
        return x @ weight + bias, np.stack(hs), np.stack(cs)


class StatefulLSTMForecaster(Forecaster):
    kind = "lstm-stateful"

    diff_std_: np.ndarray  # (C,) training std of each channel's one-step differences
    module_: StatefulNetwork
    history_: list[dict[str, float]]
    validation_rmse_: float | None

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
        super().__init__(window=window, horizon=horizon, n_channels=n_channels)
        if window < 2:
            raise ValueError("a stateful LSTM's window needs at least 2 readings (one change)")
        if hidden < 1 or layers < 1 or sequence < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError("hidden, layers and sequence must be positive, dropout in [0, 1)")
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.sequence = sequence
        self.training = training or STATEFUL_TRAINING

    def build_network(self) -> StatefulNetwork:
        """A freshly initialised network of this configuration (seed torch first)."""
        return StatefulNetwork(
            n_channels=self.n_channels,
            hidden=self.hidden,
            layers=self.layers,
            dropout=self.dropout,
            horizon=self.horizon,
        )

    @property
    def n_parameters(self) -> int:
        return parameter_count(self.build_network)

    # ---- training ---------------------------------------------------------------------------

    def fit(
        self,
        series: np.ndarray,
        *,
        train_end: int | None = None,
        progress: bool = False,
        on_epoch: EpochCallback | None = None,
    ) -> Self:
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
            validation = (windows, target_matrix(data[:, 0], split.validation, self.horizon))
        with seeded(config.seed):
            self.module_ = self.build_network()
            self.history_ = self._train(
                data[:stream_end], validation, config, config.epochs, progress, on_epoch
            )
        self.validation_rmse_ = None
        if validation is None:
            return self
        best = best_epoch(self.history_)
        self.validation_rmse_ = math.sqrt(self.history_[best - 1]["val_loss"]) * float(
            self.diff_std_[0]
        )
        if config.refit:
            everything_end = end  # every target before train_end, the epochs chosen above
            self.diff_std_ = difference_scale(data[:everything_end])
            with seeded(config.seed):
                self.module_ = self.build_network()
                self._train(data[:everything_end], None, config, best, progress, None)
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

    def _train(
        self,
        part: np.ndarray,
        validation: tuple[np.ndarray, np.ndarray] | None,
        config: TrainingConfig,
        epochs: int,
        progress: bool,
        on_epoch: EpochCallback | None,
    ) -> list[dict[str, float]]:
        """Truncated BPTT over B consecutive chunks; keeps the best validation epoch."""
        inputs, targets = self._stream_examples(part)
        n = inputs.shape[0]
        streams = max(1, min(config.batch_size, n // (2 * self.sequence)))
        length = (n - self.sequence) // streams if n > self.sequence * streams else n // streams
        if length < 1:
            raise DataError(f"too few training samples for {streams} chunks")
        rng = np.random.default_rng(config.seed)
        module = self.module_
        optimiser = torch.optim.AdamW(
            module.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        loss_fn = nn.MSELoss()
        history: list[dict[str, float]] = []
        best_loss, best_state, since_best = math.inf, None, 0
        segments = math.ceil(length / self.sequence)
        bar = tqdm(total=epochs * segments, disable=not progress, unit="seq", desc="training")
        with single_threaded(), bar:
            for epoch in range(1, epochs + 1):
                # A fresh offset each epoch moves the chunk boundaries (and the zero states).
                offset = int(rng.integers(0, n - streams * length + 1))
                block = slice(offset, offset + streams * length)
                x = torch.from_numpy(inputs[block].reshape(streams, length, -1))
                y = torch.from_numpy(targets[block].reshape(streams, length, -1))
                module.train()
                state: TorchState | None = None
                total, norms = 0.0, []
                for start in range(0, length, self.sequence):
                    stop = min(start + self.sequence, length)
                    optimiser.zero_grad(set_to_none=True)
                    out, (h, c) = module.sequence(x[:, start:stop], state)
                    loss = loss_fn(out, y[:, start:stop])
                    norms.append(clipped_step(module, optimiser, loss, config.clip_norm))
                    state = (h.detach(), c.detach())  # carried, but no gradient across the cut
                    total += loss.item() * (stop - start)
                    bar.update(1)
                record = epoch_record(epoch, total / length, norms)
                if validation is not None:
                    forecast = self._forecast_windows(validation[0])
                    error = (forecast - validation[1]) / self.diff_std_[0]
                    record["val_loss"] = float(np.mean(error**2))
                    if record["val_loss"] < best_loss:
                        best_loss, since_best = record["val_loss"], 0
                        best_state = copy.deepcopy(module.state_dict())
                    else:
                        since_best += 1
                history.append(record)
                bar.set_postfix(epoch=epoch, train=f"{record['train_loss']:.4f}")
                if on_epoch is not None:
                    on_epoch(record)
                if config.patience is not None and since_best >= config.patience:
                    break
        if best_state is not None:
            module.load_state_dict(best_state)
        module.eval()
        return history

    # ---- offline: the Forecaster interface ---------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "module_"):
            raise RuntimeError(f"{self.kind} must be fitted (or loaded) before predicting")

    def _encode(self, changes: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((changes / self.diff_std_).astype(np.float32))

    def _decode(self, outputs: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Scaled changes (B, horizon) + last readings (B,) -> forecasts, in float64."""
        forecast: np.ndarray = last[:, None] + outputs.astype(np.float64) * self.diff_std_[0]
        return forecast

    def _forecast_windows(self, windows: np.ndarray) -> np.ndarray:
        """The recurrence over each window from a zero state, read at its last step."""
        self.module_.eval()
        outputs = []
        with single_threaded(), torch.inference_mode():
            for start in range(0, windows.shape[0], PREDICT_CHUNK):
                chunk = windows[start : start + PREDICT_CHUNK]
                x = self._encode(np.diff(chunk, axis=1))
                _, (h, _) = self.module_.lstm(x)
                outputs.append(self.module_.head(h[-1]).numpy())
        return self._decode(np.concatenate(outputs), windows[:, -1, 0])

    def _predict(self, windows: np.ndarray) -> np.ndarray:
        self._check_fitted()
        return self._forecast_windows(windows)

    # ---- online: the streaming interface -----------------------------------------------------

    def initial_state(self, streams: int) -> LSTMState:
        """The zero state of `streams` fresh streams."""
        shape = (self.layers, streams, self.hidden)
        return LSTMState(h=np.zeros(shape, np.float32), c=np.zeros(shape, np.float32))

    def _readings(self, values: np.ndarray, streams: int, name: str) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        if array.ndim == 1 and self.n_channels == 1:
            array = array[:, None]
        if array.shape != (streams, self.n_channels):
            raise ValueError(
                f"{name} must be ({streams}, {self.n_channels}) for {streams} stream(s), "
                f"got {array.shape}"
            )
        if not np.isfinite(array).all():
            raise DataError(f"{name} has a missing or non-finite reading; a step needs both")
        return array

    def step(
        self, state: LSTMState, x_prev: np.ndarray, x_t: np.ndarray
    ) -> tuple[np.ndarray, LSTMState]:
        """One reading of every stream: (B, C) or (B,) previous and new readings ->
        ((B, horizon) float64 forecasts of x_{t+1}..x_{t+h}, the new state). Pure: `state`
        is left as it was."""
        self._check_fitted()
        streams = state.streams
        previous = self._readings(x_prev, streams, "x_prev")
        current = self._readings(x_t, streams, "x_t")
        x = self._encode(current - previous)
        if streams < NUMPY_STEP_LIMIT:
            out, h, c = self._numpy_lstm().step(x.numpy(), state.h, state.c)
            return self._decode(out, current[:, 0]), LSTMState(h=h, c=c)
        if streams < ONNX_STEP_LIMIT:
            out, h, c = self._onnx_lstm().sequence(x.numpy()[None], state.h, state.c)
            return self._decode(out[0], current[:, 0]), LSTMState(h=h, c=c)
        self.module_.eval()
        with single_threaded(), torch.inference_mode():
            start = (torch.from_numpy(state.h), torch.from_numpy(state.c))
            out_t, (h_t, c_t) = self.module_.step(x, start)
        forecast = self._decode(out_t.numpy(), current[:, 0])
        return forecast, LSTMState(h=h_t.numpy(), c=c_t.numpy())

    def _numpy_lstm(self) -> NumpyLSTM:
        """The network's numpy twin, made once per network (weights are not trained after)."""
        cached: NumpyLSTM | None = self.__dict__.get("numpy_lstm_")
        if cached is None or cached.module is not self.module_:
            cached = self.numpy_lstm_ = NumpyLSTM.of(self.module_)
        return cached

    def run(
        self, series: np.ndarray, state: LSTMState | None = None
    ) -> tuple[np.ndarray, LSTMState]:
        """Step a whole record at once: (T, C) or (T,) readings of ONE stream ->
        ((T - 1, horizon) forecasts made after readings 1..T-1, the final state). The same as
        calling `step` T - 1 times (for the rows after the first reading)."""
        self._check_fitted()
        data = as_2d(series)
        if data.shape[1] != self.n_channels:
            raise ValueError(f"the model reads {self.n_channels} channel(s), got {data.shape[1]}")
        if not np.isfinite(data).all():
            raise DataError("the record has a missing or non-finite reading")
        state = state or self.initial_state(1)
        if state.streams != 1:
            raise ValueError("run steps one stream; give it a state of one stream")
        x = self._encode(np.diff(data, axis=0)).numpy()[:, None]  # (T - 1, 1, C): time first
        out, h, c = self._onnx_lstm().sequence(x, state.h, state.c)
        forecast = self._decode(out[:, 0], data[1:, 0])
        return forecast, LSTMState(h=h, c=c)

    @property
    def context(self) -> int:
        return 1

    @property
    def carry_size(self) -> int:
        return 2 * self.layers * self.hidden

    def advance(
        self, history: np.ndarray, rows: np.ndarray, carry: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        count = rows.shape[0]
        previous = np.concatenate((history[:, -1:], rows[:, :-1]), axis=1)
        changes = rows - previous
        changes[:, 0] = np.where(np.isnan(changes[:, 0]), 0.0, changes[:, 0])
        x = np.ascontiguousarray((changes / self.diff_std_).astype(np.float32).transpose(1, 0, 2))
        size = self.layers * self.hidden
        h = np.ascontiguousarray(
            carry[:, :size].reshape(count, self.layers, self.hidden).transpose(1, 0, 2)
        )
        c = np.ascontiguousarray(
            carry[:, size:].reshape(count, self.layers, self.hidden).transpose(1, 0, 2)
        )
        out, h, c = self._onnx_lstm().sequence(x, h, c)
        forecast = rows[:, :, 0:1] + out.transpose(1, 0, 2).astype(np.float64) * self.diff_std_[0]
        after = np.concatenate(
            (h.transpose(1, 0, 2).reshape(count, -1), c.transpose(1, 0, 2).reshape(count, -1)),
            axis=1,
        )
        return forecast, after

    def _onnx_lstm(self) -> OnnxLSTM:
        """The network served by ONNX Runtime, built once per network."""
        cached: OnnxLSTM | None = self.__dict__.get("onnx_lstm_")
        if cached is None or cached.module is not self.module_:
            self.module_.eval()
            cached = self.onnx_lstm_ = OnnxLSTM.of(self.module_)
        return cached

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "hidden": self.hidden,
            "layers": self.layers,
            "dropout": self.dropout,
            "sequence": self.sequence,
            "training": self.training.to_dict(),
        }
