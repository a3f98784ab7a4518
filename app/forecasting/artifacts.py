"""Model artifacts: one directory per model, `manifest.json`, `weights.safetensors` and, for a
neural forecaster, `model.onnx` (its inference graph).

Weights are safetensors (plain tensors, never unpickled): what was learned, for the record and
for retraining. A neural forecaster forecasts with its graph, exported by torch at training
time; loading reads both with numpy and ONNX Runtime only (no torch). The manifest says what the
model is (kind, configuration, channels), what it was trained on (data hash, range,
statistics), how well it did (metrics) and the sha256 of the weights and of the graph, so a
truncated, tampered or mismatched artifact is refused with an `ArtifactError` instead of
producing quiet nonsense forecasts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as dump_arrays

from app.errors import AppError, ArtifactError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.graph import InferenceGraph
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import GlobalLSTMForecaster, LSTMForecaster
from app.forecasting.neural import TRAIN_EXTRA, NeuralForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig, best_epoch

FORMAT_VERSION = 2
"""2: a neural forecaster's inference graph (`model.onnx`, `graph_sha256`) is part of it."""
WEIGHTS_FILE = "weights.safetensors"
GRAPH_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
MODULE_PREFIX = "module."
EXPORT_GRAPH_COMMAND = "twinwatch model export-graph"

# Written by save_model from the forecaster itself; update_manifest may not change them.
STRUCTURAL_KEYS = frozenset(
    {
        "kind",
        "format_version",
        "config",
        "window",
        "horizon",
        "channels",
        "weights_sha256",
        "graph_sha256",
    }
)

ArrayShapes = dict[str, tuple[tuple[int, ...], np.dtype[Any]]]


@dataclass(frozen=True)
class LoadedModel:
    forecaster: Forecaster
    manifest: dict[str, Any]
    directory: Path


def _window_lstm(
    cls: type[LSTMForecaster],
) -> Callable[[dict[str, Any]], Forecaster]:
    def build(config: dict[str, Any]) -> Forecaster:
        normalisation = config.get("normalisation", cls.normalisation)
        if normalisation != cls.normalisation:
            raise ArtifactError(f"a {cls.kind} model normalises {cls.normalisation!r}")
        return cls(
            window=config["window"],
            horizon=config["horizon"],
            n_channels=config["n_channels"],
            hidden=config["hidden"],
            layers=config["layers"],
            dropout=config["dropout"],
            training=TrainingConfig(**config.get("training", {})),
        )

    return build


def _lstm_stateful(config: dict[str, Any]) -> Forecaster:
    return StatefulLSTMForecaster(
        window=config["window"],
        horizon=config["horizon"],
        n_channels=config["n_channels"],
        hidden=config["hidden"],
        layers=config["layers"],
        dropout=config["dropout"],
        sequence=config["sequence"],
        training=TrainingConfig(**config.get("training", {})),
    )


def _shape_only(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("window", "horizon", "n_channels")}


BUILDERS: dict[str, Callable[[dict[str, Any]], Forecaster]] = {
    "naive": lambda c: Naive(**_shape_only(c)),
    "seasonal-naive": lambda c: SeasonalNaive(period=c["period"], **_shape_only(c)),
    "linear-ar": lambda c: LinearAR(**_shape_only(c)),
    "lstm": _window_lstm(LSTMForecaster),
    "lstm-global": _window_lstm(GlobalLSTMForecaster),
    "lstm-stateful": _lstm_stateful,
}


def build_forecaster(config: dict[str, Any]) -> Forecaster:
    """An unfitted forecaster from its `config()` dict (the kind registry)."""
    kind = config.get("kind")
    if kind not in BUILDERS:
        raise ArtifactError(f"unknown model kind {kind!r}; known kinds: {', '.join(BUILDERS)}")
    try:
        forecaster = BUILDERS[kind](config)
    except AppError as exc:
        raise ArtifactError(f"invalid {kind} configuration: {exc.detail}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"invalid {kind} configuration: {exc!r}") from exc
    if forecaster.kind != kind:
        raise ArtifactError(f"configuration of kind {kind!r} describes a {forecaster.kind} model")
    return forecaster


def _learned_arrays(forecaster: Forecaster) -> dict[str, np.ndarray]:
    """Everything learned but the graph, as named arrays (float64 where the numbers are)."""
    if isinstance(forecaster, NeuralForecaster):
        if not forecaster.is_fitted:
            raise ArtifactError(f"cannot save a {forecaster.kind} model that has not been fitted")
        arrays = {
            MODULE_PREFIX + name: np.ascontiguousarray(array, dtype=np.float32)
            for name, array in forecaster.weights_.items()
        }
        for name, array in forecaster.scaling().items():
            arrays[name] = np.ascontiguousarray(array, dtype=np.float64)
        return arrays
    if isinstance(forecaster, LinearAR):
        if not hasattr(forecaster, "coef_"):
            raise ArtifactError("cannot save a linear AR that has not been fitted")
        return {
            "coef": np.ascontiguousarray(forecaster.coef_, dtype=np.float64),
            "intercept": np.ascontiguousarray(forecaster.intercept_, dtype=np.float64),
        }
    return {}


def _expected(forecaster: Forecaster) -> ArrayShapes:
    """Name -> (shape, dtype) the forecaster's configuration implies."""
    float32: np.dtype[Any] = np.dtype(np.float32)
    float64: np.dtype[Any] = np.dtype(np.float64)
    if isinstance(forecaster, NeuralForecaster):
        expected = {
            MODULE_PREFIX + name: (shape, float32)
            for name, shape in forecaster.weight_shapes().items()
        }
        for name, shape in forecaster.scaling_shapes().items():
            expected[name] = (shape, float64)
        return expected
    if isinstance(forecaster, LinearAR):
        return {
            "coef": ((forecaster.window, forecaster.n_channels, forecaster.horizon), float64),
            "intercept": ((forecaster.horizon,), float64),
        }
    return {}


def _restore(forecaster: Forecaster, arrays: dict[str, np.ndarray], graph: bytes | None) -> None:
    expected = _expected(forecaster)
    missing = sorted(set(expected) - set(arrays))
    unexpected = sorted(set(arrays) - set(expected))
    if missing or unexpected:
        raise ArtifactError(
            f"the weights do not fit a {forecaster.kind} model of this configuration: "
            f"missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
        )
    for name, (shape, dtype) in expected.items():
        array = arrays[name]
        if array.shape != shape or array.dtype != dtype:
            raise ArtifactError(
                f"tensor {name!r} is {array.shape} {array.dtype}, but the manifest's "
                f"configuration needs {shape} {dtype}"
            )
    if isinstance(forecaster, NeuralForecaster):
        weights = {
            name[len(MODULE_PREFIX) :]: array
            for name, array in arrays.items()
            if name.startswith(MODULE_PREFIX)
        }
        scaling = {name: arrays[name] for name in forecaster.scaling_shapes()}
        forecaster.restore(weights, scaling, graph)
    elif isinstance(forecaster, LinearAR):
        forecaster.coef_ = arrays["coef"].copy()
        forecaster.intercept_ = arrays["intercept"].copy()


def _finite_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _history_summary(history: list[dict[str, float]]) -> dict[str, Any]:
    epochs = [{k: _finite_or_none(v) for k, v in record.items()} for record in history]
    for record in epochs:
        record["epoch"] = int(record["epoch"] or 0)
    best = best_epoch(history)
    return {
        "epochs_run": len(history),
        "best_epoch": best,
        "best_val_loss": _finite_or_none(history[best - 1]["val_loss"]),
        "final_train_loss": history[-1]["train_loss"],
        "grad_norm_max": max(record["grad_norm_max"] for record in history),
        "epochs": epochs,
    }


def _derived(forecaster: Forecaster) -> dict[str, Any]:
    """Manifest fields that come from the forecaster itself."""
    config = forecaster.config()
    manifest: dict[str, Any] = {
        "kind": forecaster.kind,
        "format_version": FORMAT_VERSION,
        "window": forecaster.window,
        "horizon": forecaster.horizon,
        "config": config,
    }
    training: dict[str, Any] = {}
    if isinstance(forecaster, NeuralForecaster):
        manifest["parameter_count"] = forecaster.n_parameters
        for name, array in forecaster.scaling().items():
            training[name] = [float(v) for v in array]
        if hasattr(forecaster, "history_"):
            training["history"] = _history_summary(forecaster.history_)
    elif isinstance(forecaster, LinearAR):
        manifest["parameter_count"] = int(forecaster.coef_[:-1].size + forecaster.intercept_.size)
    else:
        manifest["parameter_count"] = 0
    manifest["training"] = training
    return manifest


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write beside the target and rename, so a crash never leaves half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shipped model from other users
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _dump_manifest(manifest: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(manifest, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"the manifest must be plain JSON without NaN: {exc}") from exc
    return (text + "\n").encode()


def _prepare_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise ArtifactError(f"{directory} exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"cannot create the model directory {directory}: {exc}") from exc


def save_model(
    forecaster: Forecaster, directory: str | Path, *, extra: dict[str, Any] | None = None
) -> Path:
    """Write the artifact; `extra` adds fields the forecaster cannot know (channel names, the
    data it was trained on, metrics). An `extra["training"]` dict is merged into the derived
    one. Returns the directory."""
    directory = Path(directory)
    weights = dump_arrays(_learned_arrays(forecaster))  # first: refuses an unfitted model
    graph = forecaster.graph_.model if isinstance(forecaster, NeuralForecaster) else None
    manifest = _derived(forecaster)
    extra = dict(extra or {})
    manifest["training"].update(extra.pop("training", {}))
    clash = STRUCTURAL_KEYS.intersection(extra) - {"channels"}
    if clash:
        raise ArtifactError(f"extra fields may not override {', '.join(sorted(clash))}")
    manifest.update(extra)
    channels = manifest.setdefault(
        "channels", ["value"] + [f"channel_{i}" for i in range(1, forecaster.n_channels)]
    )
    if len(channels) != forecaster.n_channels:
        raise ArtifactError(
            f"{len(channels)} channel name(s) for a model of {forecaster.n_channels} channel(s)"
        )
    manifest["weights_sha256"] = _sha256(weights)
    if graph is not None:
        manifest["graph_sha256"] = _sha256(graph)
    manifest["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    _validate(manifest, directory)
    payload = _dump_manifest(manifest)
    _prepare_directory(directory)
    _atomic_write(directory / WEIGHTS_FILE, weights)
    if graph is not None:
        _atomic_write(directory / GRAPH_FILE, graph)
    _atomic_write(directory / MANIFEST_FILE, payload)
    return directory


def _validate(manifest: Any, directory: Path) -> None:
    """The manifest's own consistency; the weights are checked against it in load_model."""
    where = directory / MANIFEST_FILE
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where}: expected a JSON object")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ArtifactError(f"{where}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{where}: format version {version} was written by a newer twinwatch; "
            f"this one reads up to version {FORMAT_VERSION}"
        )
    for key in ("kind", "config", "channels", "weights_sha256"):
        if key not in manifest:
            raise ArtifactError(f"{where}: missing field {key!r}")
    for key in ("weights_sha256", "graph_sha256"):
        if key in manifest and not isinstance(manifest[key], str):
            raise ArtifactError(f"{where}: {key} must be a hex string")
    config = manifest["config"]
    if not isinstance(config, dict):
        raise ArtifactError(f"{where}: config must be an object")
    if manifest["kind"] not in BUILDERS:
        raise ArtifactError(
            f"{where}: unknown model kind {manifest['kind']!r}; known kinds: {', '.join(BUILDERS)}"
        )
    if config.get("kind") != manifest["kind"]:
        raise ArtifactError(
            f"{where}: kind {manifest['kind']!r} but config says {config.get('kind')!r}"
        )
    for key in ("window", "horizon"):
        if key in manifest and manifest[key] != config.get(key):
            raise ArtifactError(
                f"{where}: {key} {manifest[key]!r} but config says {config.get(key)!r}"
            )
    channels = manifest["channels"]
    if not (isinstance(channels, list) and all(isinstance(c, str) for c in channels)):
        raise ArtifactError(f"{where}: channels must be a list of names")
    if len(channels) != config.get("n_channels"):
        raise ArtifactError(
            f"{where}: {len(channels)} channel name(s) but config says {config.get('n_channels')}"
        )


def _read_manifest(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise ArtifactError(f"no model directory at {directory}")
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise ArtifactError(f"{directory}: missing {MANIFEST_FILE}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    _validate(manifest, directory)
    assert isinstance(manifest, dict)
    return manifest


def _verified(directory: Path, name: str, sha256: str) -> bytes:
    """The bytes of `directory/name` if their hash is the manifest's."""
    path = directory / name
    if not path.is_file():
        raise ArtifactError(f"{directory}: missing {name}")
    data = path.read_bytes()
    if _sha256(data) != sha256:
        raise ArtifactError(
            f"{path}: sha256 does not match the manifest; the file was truncated or "
            "modified after the model was saved"
        )
    return data


def _read_arrays(directory: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    weights = _verified(directory, WEIGHTS_FILE, manifest["weights_sha256"])
    try:
        return load_arrays(weights)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise ArtifactError(
            f"{directory / WEIGHTS_FILE}: not a readable safetensors file ({exc})"
        ) from exc


def _read_graph(directory: Path, manifest: dict[str, Any]) -> bytes:
    if "graph_sha256" not in manifest:
        raise ArtifactError(
            f"{directory}: this {manifest['kind']} model has no inference graph (it was written "
            f"by an earlier twinwatch); add one with `{EXPORT_GRAPH_COMMAND} {directory}` "
            f"(needs the training extra: {TRAIN_EXTRA})"
        )
    if not (directory / GRAPH_FILE).is_file():
        raise ArtifactError(
            f"{directory}: missing {GRAPH_FILE}; rebuild it from the weights with "
            f"`{EXPORT_GRAPH_COMMAND} {directory}` (needs the training extra: {TRAIN_EXTRA})"
        )
    return _verified(directory, GRAPH_FILE, manifest["graph_sha256"])


def pack_forecaster(forecaster: Forecaster) -> dict[str, Any]:
    """A fitted forecaster as JSON: its configuration, its arrays (safetensors) and its graph,
    base64. How a learned stream keeps its network in the database (`unpack_forecaster`)."""
    arrays = dump_arrays(_learned_arrays(forecaster))  # first: refuses an unfitted model
    packed = {"config": forecaster.config(), "arrays": base64.b64encode(arrays).decode("ascii")}
    if isinstance(forecaster, NeuralForecaster):
        packed["graph"] = base64.b64encode(forecaster.graph_.model).decode("ascii")
    return packed


def unpack_forecaster(packed: dict[str, Any]) -> Forecaster:
    """The forecaster `pack_forecaster` wrote, verified as a loaded artifact is."""
    forecaster = build_forecaster(packed["config"])
    try:
        arrays = load_arrays(base64.b64decode(packed["arrays"], validate=True))
        graph = base64.b64decode(packed["graph"], validate=True) if "graph" in packed else None
    except (KeyError, ValueError, SafetensorError) as exc:
        raise ArtifactError(f"a packed {forecaster.kind} model is unreadable: {exc}") from exc
    if isinstance(forecaster, NeuralForecaster) and graph is None:
        raise ArtifactError(f"a packed {forecaster.kind} model has no graph")
    _restore(forecaster, arrays, graph)
    return forecaster


def load_model(directory: str | Path) -> LoadedModel:
    """Load and verify an artifact; anything missing, truncated, tampered or inconsistent is
    an ArtifactError that says which. Imports no torch."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    arrays = _read_arrays(directory, manifest)
    forecaster = build_forecaster(manifest["config"])
    graph = _read_graph(directory, manifest) if isinstance(forecaster, NeuralForecaster) else None
    _restore(forecaster, arrays, graph)
    return LoadedModel(forecaster=forecaster, manifest=manifest, directory=directory)


def export_graph(directory: str | Path) -> LoadedModel:
    """Export a neural model's inference graph from its stored weights (torch) and write it,
    with its hash in the manifest: for artifacts written before graphs were. The weights are
    verified first and left as they are; the loaded result is verified like any other."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    arrays = _read_arrays(directory, manifest)
    forecaster = build_forecaster(manifest["config"])
    if not isinstance(forecaster, NeuralForecaster):
        raise ArtifactError(f"{directory}: a {forecaster.kind} model forecasts without a graph")
    _restore(forecaster, arrays, None)
    graph = forecaster.rebuild_graph()
    InferenceGraph(graph, forecaster.signature)  # refuse to write a graph that cannot serve
    manifest["graph_sha256"] = _sha256(graph)
    manifest["format_version"] = FORMAT_VERSION
    _validate(manifest, directory)
    _atomic_write(directory / GRAPH_FILE, graph)
    _atomic_write(directory / MANIFEST_FILE, _dump_manifest(manifest))
    return load_model(directory)


def update_manifest(directory: str | Path, **fields: Any) -> dict[str, Any]:
    """Add or replace manifest fields (e.g. `thresholds` from calibration), keeping the rest.
    The artifact is fully verified first, and structural fields cannot be changed."""
    directory = Path(directory)
    manifest = load_model(directory).manifest
    clash = STRUCTURAL_KEYS.intersection(fields)
    if clash:
        raise ArtifactError(f"cannot change {', '.join(sorted(clash))} of a saved model")
    manifest.update(fields)
    _validate(manifest, directory)
    _atomic_write(directory / MANIFEST_FILE, _dump_manifest(manifest))
    return manifest
