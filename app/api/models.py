"""The model catalogue: `GET /v1/models` (each model's active version), a model with every
version, and one version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.api.deps import ReadAccess, RegistryDep, SessionDep, SingleQueryValues, StateDep
from app.catalogue import LEARNED, load_learned
from app.errors import NotFoundError
from app.registry import MODEL_NAME_PATTERN
from app.schemas import ModelDetail, ModelList, ModelOut, ModelVersionOut, problem_responses
from app.storage.repositories import model_entries
from app.storage.repositories import model_versions as version_repo

router = APIRouter(
    prefix="/v1/models", tags=["models"], dependencies=[ReadAccess, SingleQueryValues]
)

ModelNamePath = Annotated[
    str,
    Path(
        pattern=MODEL_NAME_PATTERN,
        description="The model's name (a stream's learned models: `auto.<stream id>`).",
    ),
]
VersionPath = Annotated[int, Path(ge=1, le=2**31 - 1, description="The version's number.")]


@router.get(
    "",
    response_model=ModelList,
    responses=problem_responses(422),
    summary="Loaded models (each one's active version)",
    operation_id="listModels",
)
def list_models(registry: RegistryDep) -> ModelList:
    return ModelList(items=[ModelOut.of(model) for model in registry])


@router.get(
    "/{name}",
    response_model=ModelDetail,
    responses=problem_responses(404, 422),
    summary="A model: its active version, loaded, and every version",
    operation_id="getModel",
)
def get_model(name: ModelNamePath, state: StateDep, session: SessionDep) -> ModelDetail:
    """A trained model, or the models a stream of model "auto" learned (`auto.<stream id>`:
    its first fit, the revisions of its thresholds, its jobs' candidates)."""
    model = state.registry.get(name)
    versions = [ModelVersionOut.of(row) for row in version_repo.list_for(session, name)]
    if model is not None:
        described = ModelOut.of(model)
        active = int(model.version)
    else:
        entry = model_entries.get(session, name)
        if entry is None or entry.kind != LEARNED or entry.active_version is None:
            raise NotFoundError(f"model {name!r} is not loaded", model=name)
        active = entry.active_version
        row = version_repo.require(session, name, active)
        forecaster = load_learned(state.store, row).forecaster
        described = ModelOut(
            name=name,
            version=str(active),
            kind=LEARNED,
            window=forecaster.window,
            horizon=forecaster.horizon,
            n_channels=forecaster.n_channels,
            manifest_sha256=row.artifact_sha256,
            loaded_at=row.created_at,
            metrics=row.metrics,
            thresholds=row.thresholds,
        )
    return ModelDetail(**described.model_dump(), active_version=active, versions=versions)


@router.get(
    "/{name}/versions/{version}",
    response_model=ModelVersionOut,
    responses=problem_responses(404, 422),
    summary="One version of a model",
    operation_id="getModelVersion",
)
def get_model_version(
    name: ModelNamePath, version: VersionPath, session: SessionDep
) -> ModelVersionOut:
    return ModelVersionOut.of(version_repo.require(session, name, version))
