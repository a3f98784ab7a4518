"""Request bodies validated by pydantic-core straight from their bytes: every body the API takes,
so that each is parsed by one rule (malformed or too deeply nested JSON is one problem type).

FastAPI parses a JSON body with `json.loads` and then validates the Python objects: for a
gateway's tick of 500 streams that is twice the work, and thousands of short-lived objects for
the garbage collector. `json_body(Model)` validates the bytes in one pass (the same model, the
same errors under `body`, the same 400 for malformed JSON); `json_body_openapi` documents the
body, which FastAPI no longer sees, and `app.api.openapi.document_schemas` adds its schemas.
"""

from __future__ import annotations

from email.message import Message
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.constants import REF_TEMPLATE
from pydantic import BaseModel, ValidationError

from app.schemas import (
    AcknowledgeIn,
    JobIn,
    ManyReadingsIn,
    ModelChoice,
    ReadingsIn,
    StreamConfig,
    StreamsConfig,
)

M = TypeVar("M", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # as FastAPI: a body without a content type is read as JSON
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def json_body(model: type[M]) -> Any:
    """A dependency giving the request's body as `model`, validated from its bytes."""

    async def parse(request: Request) -> M:
        raw = await request.body()
        try:
            if not raw:
                raise RequestValidationError(
                    [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
                )
            if not _is_json(request.headers.get("content-type")):
                return model.model_validate(raw)  # refused as FastAPI refuses it
            return model.model_validate_json(raw)
        except ValidationError as exc:
            errors = [
                {**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)
            ]
            raise RequestValidationError(errors, body=raw) from None

    return Depends(parse)


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route whose body is `json_body(model)`."""
    schema = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


BODIES: list[type[BaseModel]] = [
    ReadingsIn,
    ManyReadingsIn,
    StreamConfig,
    StreamsConfig,
    JobIn,
    ModelChoice,
    AcknowledgeIn,
]
"""The bodies the routes take (their schemas are added to the OpenAPI document)."""

ReadingsBody = Annotated[ReadingsIn, json_body(ReadingsIn)]
ManyReadingsBody = Annotated[ManyReadingsIn, json_body(ManyReadingsIn)]
StreamConfigBody = Annotated[StreamConfig, json_body(StreamConfig)]
StreamsConfigBody = Annotated[StreamsConfig, json_body(StreamsConfig)]
JobBody = Annotated[JobIn, json_body(JobIn)]
ModelChoiceBody = Annotated[ModelChoice, json_body(ModelChoice)]
AcknowledgeBody = Annotated[AcknowledgeIn, json_body(AcknowledgeIn)]
