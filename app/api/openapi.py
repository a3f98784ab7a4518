"""Schemas the OpenAPI document needs that FastAPI does not collect from the routes by itself."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.constants import REF_TEMPLATE
from pydantic import BaseModel

from app.schemas import problem_responses


def document_schemas(
    app: FastAPI,
    models: list[type[BaseModel]],
    *,
    writes_protected: bool = False,
    reads_protected: bool = False,
) -> None:
    """Make `app.openapi` add `models` to the components FastAPI generates: bodies validated
    from their bytes (`app.api.bodies`) and the problem answers, which routes only reference.
    Operations declare the bearer scheme (and their 401) only where this server asks for a
    token: writes with an API token, reads when they are protected."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # (FastAPI keeps it in app.openapi_schema)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template=REF_TEMPLATE)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            for path in schema.get("paths", {}).values():
                for method, operation in path.items():
                    if "security" not in operation:
                        continue
                    read = method in ("get", "head")
                    if reads_protected if read else writes_protected:
                        operation["responses"].setdefault("401", problem_responses(401)[401])
                    else:
                        del operation["security"]
                        operation["responses"].pop("401", None)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
