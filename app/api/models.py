"""The model catalogue: `GET /v1/models` (each model's active version), a model with every
version, and one version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.api.deps import ReadAccess, RegistryDep, SessionDep, SingleQueryValues
from app.errors import NotFoundError
from app.registry import NAME_PATTERN
from app.schemas import ModelDetail, ModelList, ModelOut, ModelVersionOut, problem_responses
from app.storage.repositories import model_versions as version_repo

router = APIRouter(
    prefix="/v1/models", tags=["models"], dependencies=[ReadAccess, SingleQueryValues]
)

ModelNamePath = Annotated[str, Path(pattern=NAME_PATTERN, description="The model's name.")]
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
def get_model(name: ModelNamePath, registry: RegistryDep, session: SessionDep) -> ModelDetail:
    model = registry.get(name)
    if model is None:
        raise NotFoundError(f"model {name!r} is not loaded", model=name)
    return ModelDetail(
        **ModelOut.of(model).model_dump(),
        active_version=int(model.version),
        versions=[ModelVersionOut.of(row) for row in version_repo.list_for(session, name)],
    )


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
