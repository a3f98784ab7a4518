"""Query parameters the listings share (alarms, incidents)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query

from app.schemas import STREAM_ID_PATTERN, QueryTime

StreamQuery = Annotated[str | None, Query(pattern=STREAM_ID_PATTERN)]
StateQuery = Annotated[Literal["open", "closed"] | None, Query()]
SinceQuery = Annotated[
    QueryTime | None,
    Query(description="Opened at or after (RFC 3339 with offset, or epoch seconds)."),
]
UntilQuery = Annotated[
    QueryTime | None, Query(description="Opened before (RFC 3339 with offset, or epoch seconds).")
]
LimitQuery = Annotated[int, Query(ge=1, le=1000)]
CursorQuery = Annotated[
    str | None, Query(max_length=200, description="`next_cursor` of the previous page.")
]
TakenSinceQuery = Annotated[
    QueryTime | None,
    Query(description="Readings taken at or after (RFC 3339 with offset, or epoch seconds)."),
]
TakenUntilQuery = Annotated[
    QueryTime | None,
    Query(description="Readings taken before (RFC 3339 with offset, or epoch seconds)."),
]
