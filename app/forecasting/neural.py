"""What the LSTM forecasters share: the network's architecture, its weights and the inference
graph exported from them.

A fitted (or loaded) neural forecaster holds the network's weights (`weights_`, float32, named
as torch's state dict names them: for the record and for retraining), its float64 scaling
arrays, and the graph it forecasts with (`graph_`). Only `fit` and `rebuild_graph` need torch,
and they import it when called: serving never does.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from app.errors import AppError
from app.forecasting.base import Forecaster
from app.forecasting.graph import GraphSignature, InferenceGraph
from app.forecasting.training import TrainingConfig

if TYPE_CHECKING:
    from app.forecasting.networks import LSTMNetwork

TRAIN_EXTRA = "pip install 'twinwatch[train]'"


def require_torch(purpose: str) -> None:
    """An AppError saying how to get torch, where it is missing (the plain install)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        raise AppError(f"{purpose} needs torch ({exc}): {TRAIN_EXTRA}") from None


def network_shapes(
    *, n_channels: int, hidden: int, layers: int, horizon: int
) -> dict[str, tuple[int, ...]]:
    """The weights of a stacked LSTM with a linear head, by name and shape as torch's state
    dict has them (each LSTM matrix stacks its four gates: 4 * hidden rows)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(layers):
        inputs = n_channels if layer == 0 else hidden
        shapes[f"lstm.weight_ih_l{layer}"] = (4 * hidden, inputs)
        shapes[f"lstm.weight_hh_l{layer}"] = (4 * hidden, hidden)
        shapes[f"lstm.bias_ih_l{layer}"] = (4 * hidden,)
        shapes[f"lstm.bias_hh_l{layer}"] = (4 * hidden,)
    shapes["head.weight"] = (horizon, hidden)
    shapes["head.bias"] = (horizon,)
    return shapes


class NeuralForecaster(Forecaster):
    signature: ClassVar[GraphSignature]

    weights_: dict[str, np.ndarray]
    graph_: InferenceGraph
    history_: list[dict[str, float]]
    validation_rmse_: float | None  # best-epoch validation RMSE in reading units

    def __init__(
        self,
        *,
        window: int,
        horizon: int,
        n_channels: int,
        hidden: int,
        layers: int,
        dropout: float,
        training: TrainingConfig,
    ) -> None:
        super().__init__(window=window, horizon=horizon, n_channels=n_channels)
        if hidden < 1 or layers < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError("hidden and layers must be positive, dropout in [0, 1)")
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.training = training

    # ---- what is learned ------------------------------------------------------------------

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return network_shapes(
            n_channels=self.n_channels,
            hidden=self.hidden,
            layers=self.layers,
            horizon=self.horizon,
        )

    @property
    def n_parameters(self) -> int:
        return sum(math.prod(shape) for shape in self.weight_shapes().values())

    @abstractmethod
    def scaling_shapes(self) -> dict[str, tuple[int, ...]]:
        """The float64 arrays besides the weights that encode inputs and decode outputs."""

    @abstractmethod
    def scaling(self) -> dict[str, np.ndarray]:
        """Those arrays of a fitted forecaster."""

    @abstractmethod
    def _set_scaling(self, arrays: dict[str, np.ndarray]) -> None:
        """Take stored scaling arrays; ArtifactError for values no training could give."""

    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "graph_")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(f"{self.kind} must be fitted (or loaded) before predicting")

    def restore(
        self, weights: dict[str, np.ndarray], scaling: dict[str, np.ndarray], graph: bytes | None
    ) -> None:
        """Take an artifact's weights, scaling and graph (None: one to be rebuilt with
        `rebuild_graph`, and no forecasts until then). Names and shapes are the caller's to
        check (`weight_shapes`, `scaling_shapes`); the values and the graph are checked here."""
        self.weights_ = {name: np.array(array, dtype=np.float32) for name, array in weights.items()}
        self._set_scaling({name: np.array(a, dtype=np.float64) for name, a in scaling.items()})
        if graph is not None:
            self.graph_ = InferenceGraph(graph, self.signature)

    # ---- torch: fitting and export ----------------------------------------------------------

    @abstractmethod
    def _new_network(self) -> LSTMNetwork:
        """A freshly initialised torch network of this architecture (seed torch first)."""

    @abstractmethod
    def _export(self, network: LSTMNetwork) -> bytes: ...

    def _require_torch(self) -> None:
        require_torch(f"training a {self.kind} model")

    def _adopt(self, network: LSTMNetwork) -> None:
        """Forecast from now on with the trained network's exported graph."""
        from app.forecasting import networks

        self.weights_ = networks.weights_of(network)
        self.graph_ = InferenceGraph(self._export(network), self.signature)

    def rebuild_graph(self) -> bytes:
        """Export the graph again from `weights_` (artifacts written before graphs were)."""
        require_torch("exporting a graph")
        from app.forecasting import networks

        if not hasattr(self, "weights_"):
            raise RuntimeError(f"{self.kind} has no weights to export")
        network = self._new_network()
        networks.load_weights(network, self.weights_)
        return self._export(network)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "hidden": self.hidden,
            "layers": self.layers,
            "dropout": self.dropout,
            "training": self.training.to_dict(),
        }
