"""How the operator's pages render: the templates and static files beside this package, the
filters they use, and the small formatting rules every page shares."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app.registry import AUTO, NAME_PATTERN, learned_name
from app.schemas import (
    StreamOut,
)
from app.web.access import (
    SECURITY_HEADERS,
    signed_in,
)

HERE = FilePath(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
static = StaticFiles(directory=HERE / "static")


AlarmStateFilter = Literal["open", "closed", ""]  # (the alarms' and incidents' pages)
PAGE_SIZE = 50
RECENT_ALARMS = 20  # a stream page's table of its latest alarms


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


def model_label(stream: StreamOut) -> str:
    """The model a stream runs, by the name its versions are catalogued under."""
    if stream.model == AUTO and stream.model_version:
        return learned_name(stream.id)
    return stream.model


def utc(moment: datetime | float | None) -> str:
    """A moment (or epoch seconds) for people, to the second, in UTC (every page and the chart
    say UTC)."""
    if moment is None:
        return ""
    if isinstance(moment, int | float):
        try:
            moment = datetime.fromtimestamp(moment, UTC)
        except (OverflowError, OSError, ValueError):
            return f"{moment:g} s after 1970"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def at(moment: datetime) -> str:
    """The `at` of a link to the chart at `moment` (epoch seconds)."""
    return f"{moment.timestamp():.3f}"


templates.env.filters.update(utc=utc, at=at)
templates.env.globals.update(signed_in=signed_in)


def render(request: Request, template: str, context: dict[str, Any], code: int = 200) -> Response:
    return templates.TemplateResponse(
        request, template, context, status_code=code, headers=SECURITY_HEADERS
    )


def missing(request: Request, what: str) -> Response:
    return render(request, "missing.html", {"what": what}, 404)


def named(text: str) -> bool:
    """Whether `text` can be a stream's (or a detector's) name: anything else names nothing."""
    return re.fullmatch(NAME_PATTERN, text) is not None
