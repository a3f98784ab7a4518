"""`GET /v1/models`: the loaded forecasters with their metrics and thresholds."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ReadAccess, RegistryDep
from app.schemas import ModelList, ModelOut

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[ReadAccess])


@router.get("", response_model=ModelList, summary="Loaded models", operation_id="listModels")
def list_models(registry: RegistryDep) -> ModelList:
    return ModelList(items=[ModelOut.of(model) for model in registry])
