"""Alarm events: list with filters and keyset pagination, read one, acknowledge."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import AwareDatetime

from app.api.deps import SessionDep, WriteAccess, utcnow
from app.schemas import (
    STREAM_ID_PATTERN,
    AcknowledgeIn,
    AlarmOut,
    AlarmPageOut,
    problem_responses,
)
from app.storage.repositories import alarms as alarm_repo

router = APIRouter(prefix="/v1/alarms", tags=["alarms"])

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
    stream: Annotated[str | None, Query(pattern=STREAM_ID_PATTERN)] = None,
    detector: Annotated[str | None, Query(max_length=64)] = None,
    state: Annotated[Literal["open", "closed"] | None, Query()] = None,
    since: Annotated[
        AwareDatetime | None, Query(description="Opened at or after (RFC 3339 with offset).")
    ] = None,
    until: Annotated[AwareDatetime | None, Query(description="Opened before.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None, Query(max_length=200, description="`next_cursor` of the previous page.")
    ] = None,
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
)
def acknowledge_alarm(alarm_id: AlarmIdPath, body: AcknowledgeIn, session: SessionDep) -> AlarmOut:
    return AlarmOut.of(alarm_repo.acknowledge(session, alarm_id, by=body.by, now=utcnow()))
