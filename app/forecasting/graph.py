"""An inference graph (ONNX) run by ONNX Runtime: how every neural forecaster forecasts.

Training (torch, the `train` extra) exports the graph; serving, validation and evaluation all
run it, so they cannot disagree. Each graph gets one session on one thread: intra- and inter-op
pools of one, sequential execution, no spinning. The networks are small, a second thread would
only compete with the service's other work, and on one thread each row's arithmetic does not
depend on the rows it shares a call with, nor on how a sequence is cut into calls: the stream
recurrence's replay after a crash relies on that (see `app.forecasting.base`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from app.errors import ArtifactError


@dataclass(frozen=True)
class GraphSignature:
    """The names of a graph's inputs and outputs, in order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


WINDOW_GRAPH = GraphSignature(inputs=("x",), outputs=("out",))
"""A window network: x (B, W, C) -> out (B, horizon)."""
STATEFUL_GRAPH = GraphSignature(inputs=("x", "h0", "c0"), outputs=("out", "h", "c"))
"""A recurrence: x (T, B, C), h0 and c0 (layers, B, hidden) -> out (T, B, horizon), h, c."""

STEPS_PER_CALL = 1 << 18
"""Most (row, time step) pairs one call runs: an LSTM node keeps every step's output of every
row, so an offline forecast over a long record in one call would hold gigabytes."""


def row_blocks(rows: int, steps: int) -> Iterator[slice]:
    """Consecutive blocks of `rows` rows of `steps` steps each, within `STEPS_PER_CALL`."""
    size = max(1, STEPS_PER_CALL // max(steps, 1))
    for start in range(0, rows, size):
        yield slice(start, min(start + size, rows))


def _session(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class InferenceGraph:
    """A serialised ONNX model and its session. Copies and pickles carry the bytes and open a
    new session."""

    def __init__(self, model: bytes, signature: GraphSignature) -> None:
        try:
            session = _session(model)
        except Exception as exc:  # ORT raises its own exception types, all unrelated to ours
            raise ArtifactError(f"the inference graph cannot be loaded: {exc}") from exc
        declared = (
            [i.name for i in session.get_inputs()],
            [o.name for o in session.get_outputs()],
        )
        if declared != (list(signature.inputs), list(signature.outputs)):
            raise ArtifactError(
                f"the inference graph reads {declared[0]} and writes {declared[1]}; "
                f"this model needs {list(signature.inputs)} -> {list(signature.outputs)}"
            )
        self.model = model
        self.signature = signature
        self._session = session

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model).hexdigest()

    def run(self, **feeds: np.ndarray) -> list[np.ndarray]:
        """The graph's outputs, in declared order, for float32 `feeds` named as its inputs."""
        outputs: list[np.ndarray] = self._session.run(None, feeds)
        return outputs

    def __reduce__(self) -> tuple[Any, ...]:
        return (InferenceGraph, (self.model, self.signature))
