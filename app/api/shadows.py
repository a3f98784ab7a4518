"""A candidate version shadowing a stream: `PUT /v1/streams/{id}/shadow` starts it from the
stream's next reading, `GET` compares it with the version the stream runs, `DELETE` ends it.
The comparison replays the stored readings through both (`app/streams/shadow.py`); the
candidate never raises an alarm."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.bodies import ModelChoiceBody, json_body_openapi
from app.api.deps import (
    ReadAccess,
    SessionDep,
    SingleQueryValues,
    StateDep,
    WriteAccess,
)
from app.api.streams import StreamIdPath
from app.schemas import ModelChoice, ShadowOut, problem_responses
from app.service import shadows

router = APIRouter(
    prefix="/v1/streams", tags=["models"], dependencies=[ReadAccess, SingleQueryValues]
)


@router.put(
    "/{stream_id}/shadow",
    response_model=ShadowOut,
    responses=problem_responses(400, 401, 404, 409, 413, 422),
    dependencies=[WriteAccess],
    summary="Shadow the stream with a candidate version from its next reading on",
    operation_id="putShadow",
    openapi_extra=json_body_openapi(ModelChoice),
)
def put_shadow(
    stream_id: StreamIdPath, choice: ModelChoiceBody, session: SessionDep, state: StateDep
) -> ShadowOut:
    """The candidate sees the stream's readings from its next one on and raises nothing; `GET`
    compares it with what the stream runs. A stream has one shadow at most: this replaces it."""
    return shadows.start(state, session, stream_id, choice)


@router.get(
    "/{stream_id}/shadow",
    response_model=ShadowOut,
    responses=problem_responses(404, 422),
    summary="Compare the shadowing candidate with the version the stream runs",
    operation_id="getShadow",
)
def get_shadow(stream_id: StreamIdPath, session: SessionDep, state: StateDep) -> ShadowOut:
    return shadows.compare(state, session, stream_id)


@router.delete(
    "/{stream_id}/shadow",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 404, 422),
    dependencies=[WriteAccess],
    summary="End the stream's shadow",
    operation_id="deleteShadow",
)
def delete_shadow(stream_id: StreamIdPath, session: SessionDep) -> Response:
    shadows.end(session, stream_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
