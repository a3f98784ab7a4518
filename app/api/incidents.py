"""Incidents: the alarms of a stream that overlap or follow each other closely, as one; list,
read one, acknowledge (which acknowledges its alarms too)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.api.bodies import AcknowledgeBody, json_body_openapi
from app.api.deps import ReadAccess, SessionDep, SingleQueryValues, WriteAccess, utcnow
from app.api.queries import (
    CursorQuery,
    LimitQuery,
    SinceQuery,
    StateQuery,
    StreamQuery,
    UntilQuery,
)
from app.schemas import (
    AcknowledgeIn,
    IncidentOut,
    IncidentPageOut,
    problem_responses,
)
from app.storage.repositories import incidents as incident_repo

router = APIRouter(
    prefix="/v1/incidents", tags=["incidents"], dependencies=[ReadAccess, SingleQueryValues]
)

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
    stream: StreamQuery = None,
    state: StateQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
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
    openapi_extra=json_body_openapi(AcknowledgeIn),
)
def acknowledge_incident(
    incident_id: IncidentIdPath, body: AcknowledgeBody, session: SessionDep
) -> IncidentOut:
    incident = incident_repo.acknowledge(session, incident_id, by=body.by, now=utcnow())
    return IncidentOut.of(incident, incident_repo.alarms_of(session, [incident.id])[incident.id])
