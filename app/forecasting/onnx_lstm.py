"""The stateful network's recurrence served by ONNX Runtime's CPU LSTM kernel.

One stream's sequence is the service's critical path for a long batch: 1,000 sequential steps
of the 2 x 32 network took 0.69 ms through torch (oneDNN, plus 68 us of set-up per call) and
0.48 ms here; a step of one stream took 32 us through torch's cell, 22 in numpy and 13 here
(this project's 2-core CPU, one thread). The graph is built from the module's weights (no
exporter involved): one ONNX `LSTM` node per layer, then the linear head. Outputs agree with
torch within float32 rounding (a few 1e-7, tested), not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

if TYPE_CHECKING:
    from app.forecasting.stateful_lstm import StatefulNetwork

OPSET = 17
# PyTorch stacks an LSTM's gate weights as (input, forget, cell, output); ONNX as (input,
# output, forget, cell).
_TORCH_TO_ONNX_GATES = (0, 3, 1, 2)


def _onnx_gates(matrix: np.ndarray, hidden: int) -> np.ndarray:
    blocks = [matrix[k * hidden : (k + 1) * hidden] for k in _TORCH_TO_ONNX_GATES]
    return np.concatenate(blocks)


def _graph(module: StatefulNetwork) -> bytes:
    """The serialised model: x (T, B, C), h0 and c0 (layers, B, hidden) -> out (T, B, horizon),
    h and c (layers, B, hidden), all float32."""
    lstm = module.lstm
    hidden, layers = lstm.hidden_size, lstm.num_layers

    def weight(name: str) -> np.ndarray:
        return np.asarray(getattr(lstm, name).detach().numpy(), dtype=np.float32)

    initializers, nodes = [], []
    outputs_h, outputs_c = [], []
    x = "x"
    for layer in range(layers):
        w = _onnx_gates(weight(f"weight_ih_l{layer}"), hidden)[None]
        r = _onnx_gates(weight(f"weight_hh_l{layer}"), hidden)[None]
        b = np.concatenate(
            [
                _onnx_gates(weight(f"bias_ih_l{layer}"), hidden),
                _onnx_gates(weight(f"bias_hh_l{layer}"), hidden),
            ]
        )[None]
        index = np.array([layer], dtype=np.int64)
        for name, array in (("W", w), ("R", r), ("B", b), ("layer", index)):
            initializers.append(numpy_helper.from_array(array, f"{name}{layer}"))
        nodes += [
            helper.make_node("Gather", ["h0", f"layer{layer}"], [f"start_h{layer}"], axis=0),
            helper.make_node("Gather", ["c0", f"layer{layer}"], [f"start_c{layer}"], axis=0),
            helper.make_node(
                "LSTM",
                [
                    x,
                    f"W{layer}",
                    f"R{layer}",
                    f"B{layer}",
                    "",
                    f"start_h{layer}",
                    f"start_c{layer}",
                ],
                [f"y{layer}", f"last_h{layer}", f"last_c{layer}"],
                hidden_size=hidden,
            ),
            helper.make_node("Squeeze", [f"y{layer}", "axis1"], [f"x{layer + 1}"]),
        ]
        x = f"x{layer + 1}"
        outputs_h.append(f"last_h{layer}")
        outputs_c.append(f"last_c{layer}")
    head_weight = np.ascontiguousarray(module.head.weight.detach().numpy().T, dtype=np.float32)
    head_bias = np.asarray(module.head.bias.detach().numpy(), dtype=np.float32)
    initializers += [
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(head_weight, "head_weight"),
        numpy_helper.from_array(head_bias, "head_bias"),
    ]
    nodes += [
        helper.make_node("MatMul", [x, "head_weight"], ["projected"]),
        helper.make_node("Add", ["projected", "head_bias"], ["out"]),
        helper.make_node("Concat", outputs_h, ["h"], axis=0),
        helper.make_node("Concat", outputs_c, ["c"], axis=0),
    ]
    inputs = module.lstm.input_size
    horizon = module.head.out_features

    def tensor(name: str, shape: list[str | int]) -> ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    graph = helper.make_graph(
        nodes,
        "stateful_lstm",
        [
            tensor("x", ["T", "B", inputs]),
            tensor("h0", [layers, "B", hidden]),
            tensor("c0", [layers, "B", hidden]),
        ],
        [
            tensor("out", ["T", "B", horizon]),
            tensor("h", [layers, "B", hidden]),
            tensor("c", [layers, "B", hidden]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return bytes(model.SerializeToString())


@dataclass(frozen=True)
class OnnxLSTM:
    """`StatefulNetwork.sequence` for inference, on one thread (see the module docstring)."""

    module: StatefulNetwork
    session: ort.InferenceSession

    @classmethod
    def of(cls, module: StatefulNetwork) -> OnnxLSTM:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(_graph(module), options, providers=["CPUExecutionProvider"])
        return cls(module, session)

    def sequence(
        self, x: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T, B, C) float32 inputs (time first), (layers, B, hidden) state ->
        ((T, B, horizon) outputs, final h, final c)."""
        out, h_next, c_next = self.session.run(None, {"x": x, "h0": h, "c0": c})
        return out, h_next, c_next
