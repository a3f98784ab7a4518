"""The torch side of the LSTM forecasters: networks, training loops and the export of their
inference graphs. Only fitting and `twinwatch model export-graph` import this module (torch
comes with the `train` extra); forecasting runs the exported graph (`app.forecasting.graph`).
"""

from __future__ import annotations

import copy
import io
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from app.errors import DataError
from app.forecasting.graph import STATEFUL_GRAPH, WINDOW_GRAPH, GraphSignature, row_blocks
from app.forecasting.training import (
    EpochCallback,
    TrainingConfig,
    epoch_record,
    single_threaded,
)

FORGET_GATE_BIAS = 1.0
ONNX_OPSET = 17

TorchState = tuple[torch.Tensor, torch.Tensor]
Examples = tuple[np.ndarray, np.ndarray]
"""Encoded (inputs, targets): float32 inputs (B, W, C) and the targets the network's output at
the last step is scored against (B, horizon)."""


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


class StatefulNetwork(LSTMNetwork):
    """The window LSTM's architecture (same parameters and names), read at every step."""

    def sequence(
        self, x: torch.Tensor, state: TorchState | None = None
    ) -> tuple[torch.Tensor, TorchState]:
        """(B, T, C) inputs -> ((B, T, horizon) outputs, final (h, c))."""
        out, (h, c) = self.lstm(x, state)
        result: torch.Tensor = self.head(out)
        return result, (h, c)


class _TimeMajorSequence(nn.Module):
    """`StatefulNetwork.sequence` with time first and the state as inputs: the graph's
    signature (`graph.STATEFUL_GRAPH`)."""

    def __init__(self, network: StatefulNetwork) -> None:
        super().__init__()
        self.network = network

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, (h, c) = self.network.sequence(x.transpose(0, 1), (h0, c0))
        return out.transpose(0, 1), h, c


# ---- weights ----------------------------------------------------------------------------------


def weights_of(network: nn.Module) -> dict[str, np.ndarray]:
    """The network's state dict as float32 arrays (copies)."""
    return {name: t.detach().numpy().copy() for name, t in network.state_dict().items()}


def load_weights(network: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Put stored weights into a freshly built network of the same architecture."""
    state = {name: torch.from_numpy(np.array(array)) for name, array in weights.items()}
    network.load_state_dict(state, strict=True)
    network.eval()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Fix torch's global generator (weight init, dropout) for the duration, then give the
    caller back the random state it had."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextmanager
def torch_single_threaded() -> Iterator[None]:
    """Train torch and BLAS on one thread: networks this small gain nothing from a second
    one, which on a busy machine mostly waits for its share of a core."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with single_threaded():
            yield
    finally:
        torch.set_num_threads(previous)


# ---- training ---------------------------------------------------------------------------------


def clipped_step(
    module: nn.Module, optimiser: torch.optim.Optimizer, loss: torch.Tensor, clip_norm: float
) -> float:
    """Back-propagate, clip the global gradient norm, step; the PRE-clip norm, for the log."""
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    norm = nn.utils.clip_grad_norm_(module.parameters(), clip_norm)
    optimiser.step()
    return float(norm)


def validation_loss(network: LSTMNetwork, validation: Examples) -> float:
    """Mean squared error of the network read at each window's last step (torch's forward:
    epoch selection only; the fitted model is scored through its exported graph)."""
    inputs, targets = validation
    network.eval()
    outputs = []
    with torch.inference_mode():
        for block in row_blocks(inputs.shape[0], inputs.shape[1]):
            outputs.append(network(torch.from_numpy(np.ascontiguousarray(inputs[block]))).numpy())
    error = np.concatenate(outputs).astype(np.float64) - targets
    return float(np.mean(error**2))


def _train(
    network: LSTMNetwork,
    run_epoch: Callable[[tqdm[None]], tuple[float, list[float]]],  # (loss, pre-clip norms)
    validation: Examples | None,
    config: TrainingConfig,
    *,
    epochs: int,
    steps_per_epoch: int,
    progress: bool,
    on_epoch: EpochCallback | None,
) -> list[dict[str, float]]:
    """The epoch loop both networks share. Returns one dict per epoch: train_loss, val_loss
    (NaN without validation), grad_norm_mean and grad_norm_max (the norm BEFORE clipping: how
    hard the clip worked). With validation, the network ends holding its best epoch's weights
    (early stopping after `config.patience` epochs without a better one)."""
    history: list[dict[str, float]] = []
    best_loss, best_state, since_best = math.inf, None, 0
    bar = tqdm(total=epochs * steps_per_epoch, disable=not progress, desc="training")
    with torch_single_threaded(), bar:
        for epoch in range(1, epochs + 1):
            network.train()
            record = epoch_record(epoch, *run_epoch(bar))
            if validation is not None:
                record["val_loss"] = validation_loss(network, validation)
                if record["val_loss"] < best_loss:
                    best_loss, since_best = record["val_loss"], 0
                    best_state = copy.deepcopy(network.state_dict())
                else:
                    since_best += 1
            history.append(record)
            bar.set_postfix(
                epoch=epoch, train=f"{record['train_loss']:.4f}", val=f"{record['val_loss']:.4f}"
            )
            if on_epoch is not None:
                on_epoch(record)
            if config.patience is not None and since_best >= config.patience:
                break
    if best_state is not None:
        network.load_state_dict(best_state)
    network.eval()
    return history


def train_window_network(
    network: LSTMNetwork,
    train: Examples,
    validation: Examples | None,
    config: TrainingConfig,
    *,
    epochs: int | None = None,
    progress: bool = False,
    on_epoch: EpochCallback | None = None,
) -> list[dict[str, float]]:
    """Minimise the MSE on shuffled mini-batches of windows with AdamW and global-norm
    clipping, for `epochs` (default: the config's)."""
    x_train, y_train = (torch.from_numpy(a) for a in train)
    rng = np.random.default_rng(config.seed)
    optimiser = torch.optim.AdamW(
        network.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    loss_fn = nn.MSELoss()
    n = x_train.shape[0]

    def run_epoch(bar: tqdm[None]) -> tuple[float, list[float]]:
        order = torch.from_numpy(rng.permutation(n))
        total, norms = 0.0, []
        for start in range(0, n, config.batch_size):
            index = order[start : start + config.batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(network(x_train[index]), y_train[index])
            norms.append(clipped_step(network, optimiser, loss, config.clip_norm))
            total += loss.item() * index.shape[0]
            bar.update(1)
        return total / n, norms

    return _train(
        network,
        run_epoch,
        validation,
        config,
        epochs=config.epochs if epochs is None else epochs,
        steps_per_epoch=math.ceil(n / config.batch_size),
        progress=progress,
        on_epoch=on_epoch,
    )


def train_stateful_network(
    network: StatefulNetwork,
    train: Examples,
    validation: Examples | None,
    config: TrainingConfig,
    *,
    sequence: int,
    epochs: int | None = None,
    progress: bool = False,
    on_epoch: EpochCallback | None = None,
) -> list[dict[str, float]]:
    """Truncated back-propagation through time: the training stream (inputs (n, C), targets
    (n, horizon), row j the targets after input j) is cut into B = `config.batch_size`
    consecutive chunks (chunk i always in batch row i), read `sequence` steps at a time, the
    state carried across sequence boundaries and detached at each one. For `epochs` (default:
    the config's)."""
    inputs, targets = train
    n = inputs.shape[0]
    streams = max(1, min(config.batch_size, n // (2 * sequence)))
    length = (n - sequence) // streams if n > sequence * streams else n // streams
    if length < 1:
        raise DataError(f"too few training samples for {streams} chunks")
    rng = np.random.default_rng(config.seed)
    optimiser = torch.optim.AdamW(
        network.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    loss_fn = nn.MSELoss()

    def run_epoch(bar: tqdm[None]) -> tuple[float, list[float]]:
        # A fresh offset each epoch moves the chunk boundaries (and the zero states).
        offset = int(rng.integers(0, n - streams * length + 1))
        block = slice(offset, offset + streams * length)
        x = torch.from_numpy(inputs[block].reshape(streams, length, -1))
        y = torch.from_numpy(targets[block].reshape(streams, length, -1))
        state: TorchState | None = None
        total, norms = 0.0, []
        for start in range(0, length, sequence):
            stop = min(start + sequence, length)
            optimiser.zero_grad(set_to_none=True)
            out, (h, c) = network.sequence(x[:, start:stop], state)
            loss = loss_fn(out, y[:, start:stop])
            norms.append(clipped_step(network, optimiser, loss, config.clip_norm))
            state = (h.detach(), c.detach())  # carried, but no gradient across the cut
            total += loss.item() * (stop - start)
            bar.update(1)
        return total / length, norms

    return _train(
        network,
        run_epoch,
        validation,
        config,
        epochs=config.epochs if epochs is None else epochs,
        steps_per_epoch=math.ceil(length / sequence),
        progress=progress,
        on_epoch=on_epoch,
    )


# ---- export -----------------------------------------------------------------------------------


def _export(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    signature: GraphSignature,
    dynamic_axes: dict[str, dict[int, str]],
) -> bytes:
    """The module's inference graph, serialised.

    The TorchScript exporter (dynamo=False), because the dynamo one (torch 2.13 with onnxscript
    0.7) freezes the time axis of an nn.LSTM called with an initial state at the example's length:
    ONNX Runtime then refuses other lengths. This one writes one ONNX LSTM node per layer with
    dynamic axes, and matches torch's forward within float32 rounding."""
    module.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the exporter's own notices
        # Its notes on nn.LSTM's shape checks and its caution about batch sizes do not apply:
        # the initial state is an input or built from the input's shape, and the tests run
        # other batch sizes and lengths than the example's.
        warnings.filterwarnings("ignore", "Converting a tensor to a Python boolean")
        warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size other")
        torch.onnx.export(
            module,
            example,
            buffer,  # type: ignore[arg-type]  # the TorchScript exporter writes to any file
            dynamo=False,
            opset_version=ONNX_OPSET,
            input_names=list(signature.inputs),
            output_names=list(signature.outputs),
            dynamic_axes=dynamic_axes,
        )
    return buffer.getvalue()


def export_window_graph(network: LSTMNetwork) -> bytes:
    """x (B, W, C) -> out (B, horizon), B and W free."""
    example = torch.zeros(1, 2, network.lstm.input_size)
    return _export(
        network,
        (example,),
        WINDOW_GRAPH,
        {"x": {0: "batch", 1: "time"}, "out": {0: "batch"}},
    )


def export_stateful_graph(network: StatefulNetwork) -> bytes:
    """x (T, B, C), h0 and c0 (layers, B, hidden) -> out (T, B, horizon), the final h and c;
    T and B free."""
    lstm = network.lstm
    state = torch.zeros(lstm.num_layers, 1, lstm.hidden_size)
    batch = {1: "batch"}
    return _export(
        _TimeMajorSequence(network),
        (torch.zeros(2, 1, lstm.input_size), state, state),
        STATEFUL_GRAPH,
        {
            "x": {0: "time", 1: "batch"},
            "h0": batch,
            "c0": batch,
            "out": {0: "time", 1: "batch"},
            "h": batch,
            "c": batch,
        },
    )
