"""Schemas the OpenAPI document needs that FastAPI does not collect from the routes by itself."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.constants import REF_TEMPLATE
from pydantic import BaseModel


def document_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Make `app.openapi` add `models` to the components FastAPI generates: bodies validated
    from their bytes (`app.api.bodies`) and the problem answers, which routes only reference."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # (FastAPI keeps it in app.openapi_schema)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template=REF_TEMPLATE)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
