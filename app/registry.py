"""The loaded forecasters: every artifact directory under the shipped models' directory and
the configured one (`TWINWATCH_MODELS_DIR`), keyed by its name.

Loading goes through a loader callable (by default `app.forecasting.artifacts.load_model`), so
tests can build an app from tiny in-memory artifacts. A directory that fails to load is logged
and left out (the others still serve); `errors` says why, and `/readyz` reports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from app.errors import AppError, ArtifactError, DataError
from app.forecasting.base import Forecaster
from app.settings import Settings

log = logging.getLogger(__name__)

SHIPPED_MODELS_DIR = Path(__file__).resolve().parent / "shipped_models"
"""The trained models that travel inside the package (their provenance is in its README)."""

AUTO = "auto"
"""The model of a stream that learns its own from its first readings (`app/learning`)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)

LEARNED_PREFIX = f"{AUTO}."
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,132}$"
"""A name in the catalogue: a trained model's, or `learned_name` of a stream's id."""


def learned_name(stream_id: str) -> str:
    """The catalogue's name for the models a stream of model "auto" learned (its versions: the
    first fit, each revision of its thresholds, the candidates of its jobs)."""
    return LEARNED_PREFIX + stream_id


class Artifact(Protocol):
    """What the registry needs of a loaded artifact (`app.forecasting.artifacts.LoadedModel`)."""

    @property
    def forecaster(self) -> Forecaster: ...

    @property
    def manifest(self) -> Mapping[str, Any]: ...

    @property
    def directory(self) -> Path: ...


ArtifactLoader = Callable[[Path], Artifact]


def default_loader(directory: Path) -> Artifact:
    # Imported here: it pulls in ONNX Runtime, which only the serving process needs.
    from app.forecasting.artifacts import load_model

    return load_model(directory)


def manifest_sha256(manifest: Mapping[str, Any]) -> str:
    """Hash of the manifest's canonical JSON (which names the weights' hashes): the model's id."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    version: str
    manifest_sha256: str
    loaded_at: datetime
    artifact: Artifact

    @property
    def forecaster(self) -> Forecaster:
        return self.artifact.forecaster

    @property
    def manifest(self) -> Mapping[str, Any]:
        return self.artifact.manifest

    @property
    def kind(self) -> str:
        return self.forecaster.kind

    @property
    def thresholds(self) -> dict[str, Any]:
        """Detector thresholds stored by `twinwatch calibrate`; empty until calibrated."""
        return _mapping(self.manifest.get("thresholds"))

    @property
    def metrics(self) -> dict[str, Any]:
        return _mapping(self.manifest.get("metrics"))

    @property
    def channels(self) -> list[str]:
        """The channel names the model was trained on (channel 0 is forecast)."""
        names = self.manifest.get("channels")
        n_channels = self.forecaster.n_channels
        if isinstance(names, list) and len(names) == n_channels:
            return [str(name) for name in names]
        return ["value"] + [f"channel_{i}" for i in range(1, n_channels)]


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class ModelRegistry:
    """The loaded models: each name's active version (`models`), and other versions that
    streams run (`others`, by name and version), loaded as they are needed."""

    models: Mapping[str, RegisteredModel] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)
    others: dict[tuple[str, str], RegisteredModel] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.models

    def __iter__(self) -> Iterator[RegisteredModel]:
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def get(self, name: str) -> RegisteredModel | None:
        return self.models.get(name)

    def require(self, name: str, version: str | None = None) -> RegisteredModel:
        """The model's active version, or the version asked for."""
        model = self.models.get(name)
        if version is not None and (model is None or model.version != version):
            other = self.others.get((name, version))
            if other is None:
                raise ArtifactError(f"model {name!r} version {version} is not loaded", model=name)
            return other
        if model is None:
            loaded = ", ".join(sorted(self.models)) or "none"
            raise DataError(f"model {name!r} is not loaded (loaded: {loaded})", model=name)
        return model

    def add(self, model: RegisteredModel) -> None:
        """A version loaded beside the active ones (one a stream is promoted to)."""
        self.others[(model.name, model.version)] = model


def register(
    artifact: Artifact, *, name: str, loaded_at: datetime, version: int | None = None
) -> RegisteredModel:
    """`version`: its number among the name's versions (until the catalogue has numbered it,
    the manifest's own version, or its hash's first digits)."""
    sha = manifest_sha256(artifact.manifest)
    stated = artifact.manifest.get("version")
    if version is not None:
        stated = version
    return RegisteredModel(
        name=name,
        version=str(stated) if isinstance(stated, str | int) else sha[:12],
        manifest_sha256=sha,
        loaded_at=loaded_at,
        artifact=artifact,
    )


def model_directories(settings: Settings) -> list[Path]:
    """Where the service loads models from, in order: the shipped models (unless switched
    off), then `settings.models_dir` (if set), whose models replace shipped ones of the same
    name."""
    directories = [SHIPPED_MODELS_DIR] if settings.shipped_models else []
    if settings.models_dir is not None:
        directories.append(settings.models_dir)
    return directories


def load_models(
    directories: Path | Sequence[Path],
    *,
    loaded_at: datetime,
    loader: ArtifactLoader = default_loader,
) -> ModelRegistry:
    """Load every artifact directory under each of `directories` (hidden ones and files are
    skipped). A name met again replaces what the earlier directory gave, loaded or not."""
    models: dict[str, RegisteredModel] = {}
    errors: dict[str, str] = {}
    sources: dict[str, Path] = {}
    for models_dir in [directories] if isinstance(directories, Path) else directories:
        if not models_dir.is_dir():
            log.warning("models directory %s does not exist: no model loaded from it", models_dir)
            errors[str(models_dir)] = "models directory does not exist"
            continue
        for directory in sorted(models_dir.iterdir()):
            if not directory.is_dir() or directory.name.startswith((".", "_")):
                continue
            name = directory.name
            if name in sources:
                log.info("model %s of %s replaces that of %s", name, models_dir, sources[name])
                models.pop(name, None)
                errors.pop(name, None)
            sources[name] = models_dir
            if not _NAME.fullmatch(name):
                errors[name] = f"directory name must match {NAME_PATTERN}"
                continue
            if name == AUTO or name.startswith(LEARNED_PREFIX):
                errors[name] = f"names {AUTO!r} and {LEARNED_PREFIX}* are the learned models'"
                continue
            try:
                artifact = loader(directory)
            except AppError as exc:
                errors[name] = exc.detail
                log.error("model %s not loaded: %s", name, exc.detail)
                continue
            models[name] = register(artifact, name=name, loaded_at=loaded_at)
            log.info("loaded model %s (version %s) from %s", name, models[name].version, models_dir)
    return ModelRegistry(models=models, errors=errors)
