"""Alarm events: list with filters and keyset pagination, read one, acknowledge."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

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
    AlarmOut,
    AlarmPageOut,
    problem_responses,
)
from app.storage.repositories import alarms as alarm_repo

router = APIRouter(
    prefix="/v1/alarms", tags=["alarms"], dependencies=[ReadAccess, SingleQueryValues]
)

AlarmIdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The alarm's id.")]


@router.get(
    "",
    response_model=AlarmPageOut,
    responses=problem_responses(422),
    summary="Alarms, newest first",
    operation_id="listAlarms",
)
def list_alarms(
    session: SessionDep,
    stream: StreamQuery = None,
    detector: Annotated[str | None, Query(max_length=64)] = None,
    state: StateQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    limit: LimitQuery = 100,
    cursor: CursorQuery = None,
) -> AlarmPageOut:
    page = alarm_repo.page(
        session,
        stream_id=stream,
        detector=detector,
        state=state,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
    )
    return AlarmPageOut(
        items=[AlarmOut.of(alarm) for alarm in page.items], next_cursor=page.next_cursor
    )


@router.get(
    "/{alarm_id}",
    response_model=AlarmOut,
    responses=problem_responses(404, 422),
    summary="One alarm",
    operation_id="getAlarm",
)
def get_alarm(alarm_id: AlarmIdPath, session: SessionDep) -> AlarmOut:
    return AlarmOut.of(alarm_repo.require(session, alarm_id))


@router.post(
    "/{alarm_id}/acknowledge",
    response_model=AlarmOut,
    responses=problem_responses(400, 401, 404, 413, 422),
    dependencies=[WriteAccess],
    summary="Acknowledge an alarm (idempotent: the first acknowledgement is kept)",
    operation_id="acknowledgeAlarm",
    openapi_extra=json_body_openapi(AcknowledgeIn),
)
def acknowledge_alarm(
    alarm_id: AlarmIdPath, body: AcknowledgeBody, session: SessionDep
) -> AlarmOut:
    return AlarmOut.of(alarm_repo.acknowledge(session, alarm_id, by=body.by, now=utcnow()))
