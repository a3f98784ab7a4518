"""What every body shares: the patterns of names, numbers and times a body may give, the strict
base of request bodies, and the problem documents errors are answered with."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any

from fastapi.openapi.constants import REF_TEMPLATE
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)

from app.monitoring.detectors import DETECTORS
from app.registry import NAME_PATTERN

STREAM_ID_PATTERN = NAME_PATTERN
"""Stream ids are path segments and metric labels: short, and no characters that need escaping."""

CHANNEL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
RESERVED_CHANNELS = frozenset({"t", "reference"})
MAX_CHANNELS = 128

StreamId = Annotated[str, StringConstraints(pattern=STREAM_ID_PATTERN)]
ModelName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""Every number a body gives (a reading, a threshold, a period): a finite JSON number, never a
string or true/false coerced into one."""
Count = Annotated[int, Field(strict=True)]
"""Every count a body gives: a JSON integer, never a string, a boolean or 2.0."""
Flag = Annotated[bool, Field(strict=True)]
"""Every yes-or-no a body gives: true or false, never "yes", "1" or 1."""
PositiveSeconds = Annotated[Number, Field(gt=0)]
SHORTEST_PERIOD_S, LONGEST_PERIOD_S = 0.001, 86_400.0
SamplePeriod = Annotated[Number, Field(ge=SHORTEST_PERIOD_S, le=LONGEST_PERIOD_S)]
HIGHEST_THRESHOLD = 1e9
"""A threshold no statistic reaches in practice (a billion times a learned threshold, or a
billion units of a residual): a higher one is a detector switched off in disguise; say
`"enabled": false` instead."""
LATEST_EPOCH_S = 2e10
"""The latest time a number may give (seconds since the epoch: the year 2603). Larger numbers
look like milliseconds, which are refused rather than guessed."""
EARLIEST_READING_S = 631_152_000.0
"""The earliest time a reading may carry (1990-01-01 UTC). Earlier ones are nearly always
seconds since a recording started rather than since 1970 (t = 0, 0.1, ...), refused rather than
stored as readings of 1970."""


def _known_channel(name: str) -> str:
    if name in RESERVED_CHANNELS:
        raise ValueError(f"{name!r} is reserved (readings carry 't' and 'reference' themselves)")
    return name


ChannelName = Annotated[
    str, StringConstraints(pattern=CHANNEL_PATTERN), AfterValidator(_known_channel)
]


def _known_detector(name: str) -> str:
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; known: {', '.join(sorted(DETECTORS))}")
    return name


DetectorName = Annotated[
    str,
    AfterValidator(_known_detector),
    WithJsonSchema({"type": "string", "enum": sorted(DETECTORS)}),
]


def unique_names(names: list[str]) -> list[str]:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate channel(s): {', '.join(duplicates)}")
    return names


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- problems (documentation of the error bodies) --------------------------------------------


class FieldProblem(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. body.channels.0")
    message: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details: every error the API returns has this shape."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem] | None = Field(
        None, description="Validation errors only: every offending field."
    )


PROBLEM_MEDIA_TYPE = "application/problem+json"

_PROBLEM_DESCRIPTIONS = {
    400: "Malformed JSON: the body does not parse",
    401: "The bearer token is missing or wrong",
    413: "The body (or the number of readings in it) is over the limit",
    422: "Invalid request or data; a validation error lists every offending field in `errors`",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting problem answers.

    The schema is referenced rather than given as `model`: FastAPI would file a model under the
    route's own media type (application/json). `app.api.openapi.document_schemas` registers it.
    """
    content = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": REF_TEMPLATE.format(model="Problem")}}}
    return {
        status: {
            "description": _PROBLEM_DESCRIPTIONS.get(status, HTTPStatus(status).phrase),
            "content": content,
        }
        for status in statuses
    }
