"""Model artifacts: one directory per model, `weights.safetensors` + `manifest.json`.

Weights are safetensors (plain tensors, never unpickled). The manifest says what the model is
(kind, configuration, channels), what it was trained on (data hash, range, statistics), how well
it did (metrics) and the sha256 of the weights, so a truncated, tampered or mismatched artifact
is refused with an `ArtifactError` instead of producing quiet nonsense forecasts.
"""

from __future__ import annotations

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
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as dump_tensors

from app.errors import AppError, ArtifactError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig, best_epoch

FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
MANIFEST_FILE = "manifest.json"
MODULE_PREFIX = "module."

# Written by save_model from the forecaster itself; update_manifest may not change them.
STRUCTURAL_KEYS = frozenset(
    {"kind", "format_version", "config", "window", "horizon", "channels", "weights_sha256"}
)


@dataclass(frozen=True)
class LoadedModel:
    forecaster: Forecaster
    manifest: dict[str, Any]
    directory: Path


def _lstm(config: dict[str, Any]) -> Forecaster:
    return LSTMForecaster(
        window=config["window"],
        horizon=config["horizon"],
        n_channels=config["n_channels"],
        hidden=config["hidden"],
        layers=config["layers"],
        dropout=config["dropout"],
        normalisation=config["normalisation"],
        training=TrainingConfig(**config.get("training", {})),
    )


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
    "lstm": _lstm,
    "lstm-global": _lstm,
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


def _state_tensors(forecaster: Forecaster) -> dict[str, torch.Tensor]:
    """Everything learned, as named tensors (float64 where the numbers are float64)."""
    if isinstance(forecaster, LSTMForecaster):
        if not hasattr(forecaster, "module_"):
            raise ArtifactError("cannot save an LSTM that has not been fitted")
        state = {
            MODULE_PREFIX + name: tensor.detach().clone().contiguous()
            for name, tensor in forecaster.module_.state_dict().items()
        }
        state["mean"] = torch.from_numpy(np.array(forecaster.mean_, dtype=np.float64))
        state["std"] = torch.from_numpy(np.array(forecaster.std_, dtype=np.float64))
        return state
    if isinstance(forecaster, StatefulLSTMForecaster):
        if not hasattr(forecaster, "module_"):
            raise ArtifactError("cannot save a stateful LSTM that has not been fitted")
        state = {
            MODULE_PREFIX + name: tensor.detach().clone().contiguous()
            for name, tensor in forecaster.module_.state_dict().items()
        }
        state["diff_std"] = torch.from_numpy(np.array(forecaster.diff_std_, dtype=np.float64))
        return state
    if isinstance(forecaster, LinearAR):
        if not hasattr(forecaster, "coef_"):
            raise ArtifactError("cannot save a linear AR that has not been fitted")
        return {
            "coef": torch.from_numpy(np.ascontiguousarray(forecaster.coef_, dtype=np.float64)),
            "intercept": torch.from_numpy(np.array(forecaster.intercept_, dtype=np.float64)),
        }
    return {}


def _expected(forecaster: Forecaster) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) the forecaster's configuration implies."""
    if isinstance(forecaster, LSTMForecaster):
        with torch.device("meta"):  # shapes only: no memory, no draw from the global RNG
            module = forecaster.build_network()
        expected = {
            MODULE_PREFIX + name: (tuple(t.shape), t.dtype)
            for name, t in module.state_dict().items()
        }
        channels = (forecaster.n_channels,)
        return {**expected, "mean": (channels, torch.float64), "std": (channels, torch.float64)}
    if isinstance(forecaster, StatefulLSTMForecaster):
        with torch.device("meta"):
            stateful = forecaster.build_network()
        expected = {
            MODULE_PREFIX + name: (tuple(t.shape), t.dtype)
            for name, t in stateful.state_dict().items()
        }
        return {**expected, "diff_std": ((forecaster.n_channels,), torch.float64)}
    if isinstance(forecaster, LinearAR):
        return {
            "coef": (
                (forecaster.window, forecaster.n_channels, forecaster.horizon),
                torch.float64,
            ),
            "intercept": ((forecaster.horizon,), torch.float64),
        }
    return {}


def _restore(forecaster: Forecaster, tensors: dict[str, torch.Tensor]) -> None:
    expected = _expected(forecaster)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ArtifactError(
            f"the weights do not fit a {forecaster.kind} model of this configuration: "
            f"missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
        )
    for name, (shape, dtype) in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ArtifactError(
                f"tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype}, but the manifest's "
                f"configuration needs {shape} {dtype}"
            )
    if isinstance(forecaster, LSTMForecaster):
        with torch.device("meta"):
            module = forecaster.build_network()
        state = {
            name[len(MODULE_PREFIX) :]: t
            for name, t in tensors.items()
            if name.startswith(MODULE_PREFIX)
        }
        module.load_state_dict(state, strict=True, assign=True)
        module.eval()
        forecaster.module_ = module
        forecaster.mean_ = tensors["mean"].numpy().copy()
        forecaster.std_ = tensors["std"].numpy().copy()
        if not np.all(forecaster.std_ > 0):
            raise ArtifactError("the stored training std must be positive")
    elif isinstance(forecaster, StatefulLSTMForecaster):
        with torch.device("meta"):
            network = forecaster.build_network()
        network.load_state_dict(
            {
                name[len(MODULE_PREFIX) :]: t
                for name, t in tensors.items()
                if name.startswith(MODULE_PREFIX)
            },
            strict=True,
            assign=True,
        )
        network.eval()
        forecaster.module_ = network
        forecaster.diff_std_ = tensors["diff_std"].numpy().copy()
        if not np.all(forecaster.diff_std_ > 0):
            raise ArtifactError("the stored std of the differences must be positive")
    elif isinstance(forecaster, LinearAR):
        forecaster.coef_ = tensors["coef"].numpy().copy()
        forecaster.intercept_ = tensors["intercept"].numpy().copy()


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
    if isinstance(forecaster, LSTMForecaster):
        manifest["parameter_count"] = forecaster.n_parameters
        training["mean"] = [float(v) for v in forecaster.mean_]
        training["std"] = [float(v) for v in forecaster.std_]
        training["history"] = _history_summary(forecaster.history_)
    elif isinstance(forecaster, StatefulLSTMForecaster):
        manifest["parameter_count"] = forecaster.n_parameters
        training["diff_std"] = [float(v) for v in forecaster.diff_std_]
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
    weights = dump_tensors(_state_tensors(forecaster))  # first: refuses an unfitted model
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
    manifest["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    _validate(manifest, directory)
    payload = _dump_manifest(manifest)
    _prepare_directory(directory)
    _atomic_write(directory / WEIGHTS_FILE, weights)
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


def load_model(directory: str | Path) -> LoadedModel:
    """Load and verify an artifact; anything missing, truncated, tampered or inconsistent is
    an ArtifactError that says which."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ArtifactError(f"{directory}: missing {WEIGHTS_FILE}")
    weights = weights_path.read_bytes()
    if _sha256(weights) != manifest["weights_sha256"]:
        raise ArtifactError(
            f"{weights_path}: sha256 does not match the manifest; the file was truncated or "
            "modified after the model was saved"
        )
    forecaster = build_forecaster(manifest["config"])
    try:
        tensors = load_tensors(weights)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{weights_path}: not a readable safetensors file ({exc})") from exc
    _restore(forecaster, tensors)
    return LoadedModel(forecaster=forecaster, manifest=manifest, directory=directory)


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
