"""`/incidents`: incidents (the alarms of one fault together), open and recent, each with its
alarms and its moment on the chart, acknowledged with a name."""

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
from app.registry import AUTO
from app.schemas import (
    AlarmOut,
    IncidentOut,
)
from app.settings import Settings
from app.storage.models import Incident
from app.storage.repositories import incidents as incident_repo
from app.storage.repositories import streams as stream_repo
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
class IncidentFilters:
    """What the incidents page shows: every field empty shows every incident."""

    stream: str = ""
    state: AlarmStateFilter = ""

    def query(self) -> str:
        return urlencode({key: value for key, value in asdict(self).items() if value})


@router.get("/incidents", response_class=HTMLResponse, dependencies=[PageReader])
def incidents_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    stream: Annotated[str, Query(max_length=128)] = "",
    state: Annotated[AlarmStateFilter, Query()] = "",
    cursor: CursorQuery = None,
    acknowledged: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> Response:
    """Incidents (the alarms of one fault together, the unit an operator acknowledges), open
    and recent, newest first: each with its alarms, a link to the stream's chart at its
    start, and for a stream that learned its model the way to a new normal."""
    filters = IncidentFilters(stream.strip(), state)
    done = None
    if acknowledged is not None:
        found = incident_repo.get(session, acknowledged)
        done = found if found is not None and found.acknowledged_at is not None else None
    return _incidents(request, session, settings, filters, cursor, here(request), done=done)


def _incidents(
    request: Request,
    session: Session,
    settings: Settings,
    filters: IncidentFilters,
    cursor: str | None,
    back: str,
    *,
    done: Incident | None = None,
    refusal: Refusal | None = None,
) -> Response:
    incidents: list[Incident] = []
    next_cursor = None
    if not filters.stream or named(filters.stream):
        page = incident_repo.page(
            session,
            stream_id=filters.stream or None,
            state=filters.state or None,
            limit=PAGE_SIZE,
            cursor=cursor,
        )
        incidents, next_cursor = page.items, page.next_cursor
    alarms = incident_repo.alarms_of(session, [incident.id for incident in incidents])
    learning = {
        stream.id
        for stream in stream_repo.get_many(session, sorted({i.stream_id for i in incidents}))
        if stream.model_name == AUTO
    }
    return render(
        request,
        "incidents.html",
        {
            "incidents": [IncidentOut.of(incident, alarms[incident.id]) for incident in incidents],
            "alarms": {
                incident.id: [AlarmOut.of(alarm) for alarm in alarms[incident.id]]
                for incident in incidents
            },
            "learning": learning,
            "filters": filters,
            "query": filters.query(),
            "next_cursor": next_cursor,
            "cursor": cursor,
            "token_needed": not holds(request, settings.write_tokens()),
            "name": remembered_name(request) if refusal is None else refusal.name,
            "back": back,
            "done": None if done is None else IncidentOut.of(done, []),
            "refusal": refusal,
        },
        200 if refusal is None else refusal.status,
    )


@router.post(
    "/incidents/{incident_id}/acknowledge",
    response_class=HTMLResponse,
    dependencies=[SameSite, PageReader],
)
def acknowledge_incident_page(
    request: Request,
    incident_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    session: SessionDep,
    settings: SettingsDep,
    by: Annotated[str, Form(max_length=1000)] = "",
    token: Annotated[str, Form(max_length=1000)] = "",
    back: Annotated[str, Form(max_length=2000)] = "/incidents",
) -> Response:
    """A page's acknowledgement of an incident and its alarms, as the alarms page's."""
    given = token.strip()
    back = local(back, "/incidents")
    who = who_acts(
        request,
        settings,
        f"Incident {incident_id}",
        lambda: incident_repo.get(session, incident_id) is not None,
        by,
        given,
    )
    if isinstance(who, Refusal):
        given_filters = dict(parse_qsl(urlsplit(back).query))
        state = given_filters.get("state", "")
        filters = IncidentFilters(
            given_filters.get("stream", "").strip()[:128],
            state if state in ("open", "closed") else "",  # type: ignore[arg-type]
        )
        return _incidents(request, session, settings, filters, None, back, refusal=who)
    incident_repo.acknowledge(session, incident_id, by=who, now=utcnow())
    return acknowledged(request, back, incident_id, who, given)
