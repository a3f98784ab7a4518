"""Incidents: the alarms of a stream that overlap or follow each other closely, as one; list,
read one, acknowledge (which acknowledges its alarms too)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import AwareDatetime

from app.api.deps import SessionDep, WriteAccess, utcnow
from app.schemas import (
    STREAM_ID_PATTERN,
    AcknowledgeIn,
    IncidentOut,
    IncidentPageOut,
    problem_responses,
)
from app.storage.repositories import incidents as incident_repo

router = APIRouter(prefix="/v1/incidents", tags=["incidents"])

IncidentIdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The incident's id.")]


@router.get(
    "",
    response_model=IncidentPageOut,
    responses=problem_responses(422),
    summary="Incidents, newest first",
    operation_id="listIncidents",
)
def list_incidents(
    session: SessionDep,
    stream: Annotated[str | None, Query(pattern=STREAM_ID_PATTERN)] = None,
    state: Annotated[Literal["open", "closed"] | None, Query()] = None,
    since: Annotated[
        AwareDatetime | None, Query(description="Opened at or after (RFC 3339 with offset).")
    ] = None,
    until: Annotated[AwareDatetime | None, Query(description="Opened before.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None, Query(max_length=200, description="`next_cursor` of the previous page.")
    ] = None,
) -> IncidentPageOut:
    page = incident_repo.page(
        session,
        stream_id=stream,
        state=state,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
    )
    alarms = incident_repo.alarms_of(session, [incident.id for incident in page.items])
    return IncidentPageOut(
        items=[IncidentOut.of(incident, alarms[incident.id]) for incident in page.items],
        next_cursor=page.next_cursor,
    )


@router.get(
    "/{incident_id}",
    response_model=IncidentOut,
    responses=problem_responses(404, 422),
    summary="One incident with each detector's first alarm and peak",
    operation_id="getIncident",
)
def get_incident(incident_id: IncidentIdPath, session: SessionDep) -> IncidentOut:
    incident = incident_repo.require(session, incident_id)
    return IncidentOut.of(incident, incident_repo.alarms_of(session, [incident.id])[incident.id])


@router.post(
    "/{incident_id}/acknowledge",
    response_model=IncidentOut,
    responses=problem_responses(400, 401, 404, 413, 422),
    dependencies=[WriteAccess],
    summary="Acknowledge an incident and its alarms (idempotent: the first is kept)",
    operation_id="acknowledgeIncident",
)
def acknowledge_incident(
    incident_id: IncidentIdPath, body: AcknowledgeIn, session: SessionDep
) -> IncidentOut:
    incident = incident_repo.acknowledge(session, incident_id, by=body.by, now=utcnow())
    return IncidentOut.of(incident, incident_repo.alarms_of(session, [incident.id])[incident.id])
