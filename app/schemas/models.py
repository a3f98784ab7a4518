"""Models, their versions, the choice of one for a stream, and health."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from app.registry import MODEL_NAME_PATTERN, RegisteredModel
from app.schemas.common import Count, StrictBody
from app.storage.models import ModelVersion

# --- models and health -------------------------------------------------------------------------


class ModelOut(BaseModel):
    name: str
    version: str
    kind: str
    window: int
    horizon: int
    n_channels: int
    manifest_sha256: str
    loaded_at: datetime
    metrics: dict[str, Any]
    thresholds: dict[str, Any]

    @classmethod
    def of(cls, model: RegisteredModel) -> ModelOut:
        forecaster = model.forecaster
        return cls(
            name=model.name,
            version=model.version,
            kind=model.kind,
            window=forecaster.window,
            horizon=forecaster.horizon,
            n_channels=forecaster.n_channels,
            manifest_sha256=model.manifest_sha256,
            loaded_at=model.loaded_at,
            metrics=model.metrics,
            thresholds=model.thresholds,
        )


class ModelList(BaseModel):
    items: list[ModelOut]


class ModelVersionOut(BaseModel):
    """One version of a model, as the catalogue keeps it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "lstm-seed0",
                    "version": 1,
                    "kind": "lstm",
                    "artifact_sha256": "9f2c" + "0" * 60,
                    "status": "active",
                    "source": {"directory": "/srv/twinwatch/models/lstm-seed0"},
                    "metrics": {"rmse": 0.133},
                    "thresholds": {"detectors": [{"kind": "point", "threshold": 0.525}]},
                    "calibration": {},
                    "created_by": "models directory",
                    "created_at": "2026-12-01T23:00:00Z",
                }
            ]
        }
    )

    name: str
    version: int
    kind: str
    artifact_sha256: str = Field(
        description="Its manifest's hash: the artifact's name in the store."
    )
    status: Literal["candidate", "active", "retired"] = Field(
        description="active: the model's default version, or one a stream runs; candidate: no "
        "stream has run it yet; retired: no stream runs it any more."
    )
    source: dict[str, Any] = Field(description="Where it came from (a models directory).")
    metrics: dict[str, Any]
    thresholds: dict[str, Any]
    calibration: dict[str, Any] = Field(description="How its thresholds were set.")
    created_by: str
    created_at: datetime

    @classmethod
    def of(cls, row: ModelVersion) -> ModelVersionOut:
        return cls.model_validate(row, from_attributes=True)


class ModelDetail(ModelOut):
    active_version: int = Field(description="The version streams run unless they name one.")
    versions: list[ModelVersionOut] = Field(description="Every version, oldest first.")


class ModelChoice(StrictBody):
    """A model version for a stream to run from its next reading on."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "lstm-seed0", "version": 2},
                {"name": "auto.pump-7", "version": 5},
            ]
        },
    )

    name: str = Field(
        pattern=MODEL_NAME_PATTERN,
        max_length=133,
        description="The model's name (a stream's learned models: `auto.<stream id>`).",
    )
    version: Count = Field(ge=1, le=2**31 - 1, description="One of its versions.")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]
