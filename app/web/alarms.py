"""`/alarms`: alarms across streams, filtered, each acknowledged with a name."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from app.api.deps import (
    SessionDep,
    SettingsDep,
    SingleQueryValues,
    utcnow,
)
from app.api.queries import CursorQuery
from app.monitoring.detectors import DETECTORS
from app.schemas import (
    AlarmOut,
)
from app.settings import Settings
from app.storage.models import Alarm
from app.storage.repositories import alarms as alarm_repo
from app.streams.stale import STALE
from app.web.access import (
    PageReader,
    SameSite,
    here,
    holds,
    local,
    remembered_name,
)
from app.web.acting import Refusal, acknowledged, who_acts
from app.web.rendering import PAGE_SIZE, AlarmStateFilter, named, render

router = APIRouter(include_in_schema=False, dependencies=[SingleQueryValues])


@dataclass(frozen=True)
class AlarmFilters:
    """What the alarms page shows: every field empty shows every alarm."""

    stream: str = ""
    detector: str = ""
    state: AlarmStateFilter = ""

    @classmethod
    def of_page(cls, address: str) -> AlarmFilters:
        """The filters of an alarms page's address (a form's return address)."""
        given = dict(parse_qsl(urlsplit(address).query))
        state = given.get("state", "")
        return cls(
            stream=given.get("stream", "").strip()[:128],
            detector=given.get("detector", "").strip()[:64],
            state=state if state in ("open", "closed") else "",  # type: ignore[arg-type]
        )

    def query(self) -> str:
        return urlencode({key: value for key, value in asdict(self).items() if value})

    def possible(self) -> bool:
        """Whether any alarm could match (a stream or detector name of other characters names
        none, and is not worth a query)."""
        return all(named(text) for text in (self.stream, self.detector) if text)


@router.get("/alarms", response_class=HTMLResponse, dependencies=[PageReader])
def alarms_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    stream: Annotated[str, Query(max_length=128)] = "",
    detector: Annotated[str, Query(max_length=64)] = "",
    state: Annotated[AlarmStateFilter, Query()] = "",
    cursor: CursorQuery = None,
    acknowledged: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> Response:
    filters = AlarmFilters(stream.strip(), detector.strip(), state)
    done = None if acknowledged is None else alarm_repo.get(session, acknowledged)
    if done is not None and done.acknowledged_at is None:
        done = None
    return _alarms(request, session, settings, filters, cursor, here(request), done=done)


def _alarms(
    request: Request,
    session: Session,
    settings: Settings,
    filters: AlarmFilters,
    cursor: str | None,
    back: str,
    *,
    done: Alarm | None = None,
    refusal: Refusal | None = None,
) -> Response:
    alarms: list[Alarm] = []
    next_cursor = None
    if filters.possible():
        page = alarm_repo.page(
            session,
            stream_id=filters.stream or None,
            detector=filters.detector or None,
            state=filters.state or None,
            limit=PAGE_SIZE,
            cursor=cursor,
        )
        alarms, next_cursor = page.items, page.next_cursor
    return render(
        request,
        "alarms.html",
        {
            "alarms": [AlarmOut.of(alarm) for alarm in alarms],
            "filters": filters,
            "query": filters.query(),
            "next_cursor": next_cursor,
            "cursor": cursor,
            "detectors": sorted({*DETECTORS, STALE}),
            "token_needed": not holds(request, settings.write_tokens()),
            "name": remembered_name(request) if refusal is None else refusal.name,
            "back": back,
            "done": None if done is None else AlarmOut.of(done),
            "refusal": refusal,
        },
        200 if refusal is None else refusal.status,
    )


@router.post(
    "/alarms/{alarm_id}/acknowledge",
    response_class=HTMLResponse,
    dependencies=[SameSite, PageReader],
)
def acknowledge(
    request: Request,
    alarm_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    session: SessionDep,
    settings: SettingsDep,
    by: Annotated[str, Form(max_length=1000)] = "",
    token: Annotated[str, Form(max_length=1000)] = "",
    back: Annotated[str, Form(max_length=2000)] = "/alarms",
) -> Response:
    """A page's acknowledgement: the name given, and the API token (when the service requires
    one) from the form or the session. A refusal answers the alarms page with the reason."""
    given = token.strip()
    back = local(back, "/alarms")
    who = who_acts(
        request,
        settings,
        f"Alarm {alarm_id}",
        lambda: alarm_repo.get(session, alarm_id) is not None,
        by,
        given,
    )
    if isinstance(who, Refusal):
        return _alarms(
            request, session, settings, AlarmFilters.of_page(back), None, back, refusal=who
        )
    alarm_repo.acknowledge(session, alarm_id, by=who, now=utcnow())
    return acknowledged(request, back, alarm_id, who, given)
