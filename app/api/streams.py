"""Stream configuration: `PUT/GET/DELETE /v1/streams/{stream_id}` and `GET /v1/streams`.

Readings and forecasts (`POST .../readings`, `GET .../forecast`) live in `app/api/readings.py`
(`app/api/readings.py`).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from pydantic_core import to_json

from app.api.bodies import ModelChoiceBody, StreamConfigBody, StreamsConfigBody, json_body_openapi
from app.api.changes import forward
from app.api.deps import (
    ReadAccess,
    SessionDep,
    SingleQueryValues,
    StateDep,
    WriteAccess,
)
from app.api.queries import CursorQuery, LimitQuery
from app.schemas import (
    STREAM_ID_PATTERN,
    ModelChoice,
    StreamConfig,
    StreamList,
    StreamOut,
    StreamsConfig,
    StreamsConfigured,
    problem_responses,
)
from app.service import streams as service
from app.storage.repositories import streams as stream_repo

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/streams", tags=["streams"], dependencies=[ReadAccess, SingleQueryValues]
)

StreamIdPath = Annotated[
    str,
    Path(
        pattern=STREAM_ID_PATTERN,
        description="1-128 characters: letters, digits, '.', '_', '-'; starts alphanumeric.",
    ),
]


@router.put(
    "/{stream_id}",
    response_model=StreamOut,
    status_code=status.HTTP_200_OK,
    responses={201: {"model": StreamOut}, **problem_responses(400, 401, 409, 413, 422)},
    dependencies=[WriteAccess],
    summary="Create or update a stream",
    operation_id="putStream",
    openapi_extra=json_body_openapi(StreamConfig),
)
def put_stream(
    stream_id: StreamIdPath,
    config: StreamConfigBody,
    session: SessionDep,
    state: StateDep,
    response: Response,
) -> StreamOut | Response:
    """Create the stream (201) or replace its configuration (200).

    The model, the channels and `has_reference` shape the stream's state and stored readings:
    once it has accepted readings they cannot change (409); delete and re-create it instead.
    Detector overrides and the sample period can change at any time; so can a learning stream's
    learning period and budget until it has learned (a change restarts a fit in progress).
    """
    if state.bus is not None and stream_repo.get(session, stream_id) is not None:
        # The model named as this process names it: its default may not be the worker's.
        named = config.model_dump(mode="json", exclude_unset=True)
        named["model"] = config.model or state.settings.default_model
        session.rollback()  # (it wrote nothing: its connection is not held while it waits)
        return forward(state, "configure", stream_id, to_json(named))
    configured = service.configure(state, session, stream_id, config)
    if configured.created:
        response.status_code = status.HTTP_201_CREATED
    return configured.stream


@router.put(
    "",
    response_model=StreamsConfigured,
    responses=problem_responses(400, 401, 404, 409, 413, 422),
    dependencies=[WriteAccess],
    summary="Create or update many streams at once",
    operation_id="putStreams",
    openapi_extra=json_body_openapi(StreamsConfig),
)
def put_streams(body: StreamsConfigBody, session: SessionDep, state: StateDep) -> StreamsConfigured:
    """Onboard a fleet: every stream of the body is created, or its configuration replaced, by
    the rules of its own PUT, all or nothing (a problem names the stream it is about). On the
    bus, this creates streams only: reconfigure existing ones one at a time."""
    return service.configure_many(
        state,
        session,
        [(item.id, item) for item in body.streams],
        create_only=state.bus is not None,
    )


@router.get(
    "",
    response_model=StreamList,
    responses=problem_responses(422),
    summary="Streams in id order, a page at a time",
    operation_id="listStreams",
)
def list_streams(
    session: SessionDep, state: StateDep, limit: LimitQuery = 100, cursor: CursorQuery = None
) -> StreamList:
    return service.stream_page(session, state, limit=limit, cursor=cursor)


@router.get(
    "/{stream_id}",
    response_model=StreamOut,
    responses=problem_responses(404, 422),
    summary="One stream with its open alarms",
    operation_id="getStream",
)
def get_stream(stream_id: StreamIdPath, session: SessionDep, state: StateDep) -> StreamOut:
    return service.described(state, session, stream_repo.require(session, stream_id))


@router.post(
    "/{stream_id}/model",
    response_model=StreamOut,
    responses=problem_responses(400, 401, 404, 409, 413, 422),
    dependencies=[WriteAccess],
    summary="Run a model version on the stream: promote a candidate, or roll back",
    operation_id="switchStreamModel",
    openapi_extra=json_body_openapi(ModelChoice),
)
def switch_model(
    stream_id: StreamIdPath, choice: ModelChoiceBody, session: SessionDep, state: StateDep
) -> StreamOut | Response:
    """From its next reading on, the stream runs the version named (of its model, or of
    another with as many channels). Readings are never lost, skipped or processed twice: the
    switch holds the stream as a request of readings does. The new version starts warm: it has
    seen the stream's last stored readings (up to 2,000), silently. The alarms the old version
    had open close at the switch; the alarms that follow name the new version. Rolling back is
    the same call with the previous version (the answer's `model_version` before the call).
    A stream of model "auto" runs the versions of its own learned models, named
    `auto.<stream id>`: its first fit, the revisions of its thresholds, its jobs' candidates."""
    if state.bus is not None:
        return forward(state, "switch", stream_id, choice.model_dump_json().encode())
    return service.switch(state, session, stream_id, choice)


@router.delete(
    "/{stream_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 404, 422),
    dependencies=[WriteAccess],
    summary="Delete a stream with its readings, checkpoint and alarms",
    operation_id="deleteStream",
)
def delete_stream(stream_id: StreamIdPath, session: SessionDep, state: StateDep) -> Response:
    if state.bus is not None:
        return forward(state, "delete", stream_id)
    service.delete(state, session, stream_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
