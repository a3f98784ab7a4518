"""The operator's pages, served by the service itself: server-rendered HTML (Jinja2 templates
beside this file), no script needed to read them, a stylesheet of our own and nothing fetched
from elsewhere. `/` lists the streams, a page at a time, from the same query as
`GET /v1/streams`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app.api.deps import ReadAccess, SessionDep, SingleQueryValues, StateDep
from app.api.queries import CursorQuery
from app.api.streams import stream_page
from app.registry import AUTO, learned_name
from app.schemas import StreamOut

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
static = StaticFiles(directory=HERE / "static")

router = APIRouter(include_in_schema=False, dependencies=[ReadAccess, SingleQueryValues])

PAGE_SIZE = 50


def state_of(stream: StreamOut) -> str:
    """What the table shows first: learning, alarm, stale or monitoring."""
    detectors = {alarm.detector for alarm in stream.open_alarms}
    if stream.phase == "learning":
        return "learning"
    if detectors - {"stale", "missing"}:
        return "alarm"
    if "stale" in detectors:
        return "stale"
    return "monitoring"


def age(moment: datetime | None, now: datetime) -> str:
    """How long ago, for people: '12 s ago', '3 min ago', '2 h ago', '5 d ago'."""
    if moment is None:
        return "never"
    seconds = max(0.0, (now - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


@router.get("/", response_class=HTMLResponse)
def streams_page(
    request: Request,
    session: SessionDep,
    state: StateDep,
    q: Annotated[str | None, Query(max_length=128)] = None,
    cursor: CursorQuery = None,
) -> HTMLResponse:
    prefix = (q or "").strip() or None
    page = stream_page(session, state, limit=PAGE_SIZE, cursor=cursor, prefix=prefix)
    now = datetime.now(UTC)
    rows = [
        {
            "stream": stream,
            "state": state_of(stream),
            "model": (
                learned_name(stream.id)
                if stream.model == AUTO and stream.model_version
                else stream.model
            ),
            "seen": age(stream.last_t, now),
            "alarms": [a for a in stream.open_alarms if a.detector != "stale"],
        }
        for stream in page.items
    ]
    return templates.TemplateResponse(
        request,
        "streams.html",
        {"rows": rows, "q": prefix or "", "next_cursor": page.next_cursor, "cursor": cursor},
    )
