"""The streams' pages: the list (`/`), a stream's page with its chart, facts and shadow, and an
operator's new normal (a retrain job from a moment, then running the version it made)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.api.deps import (
    AppState,
    SessionDep,
    SingleQueryValues,
    StateDep,
)
from app.api.queries import CursorQuery
from app.api.streams import switch_model
from app.errors import AppError, DataError
from app.schemas import (
    AlarmOut,
    JobIn,
    JobOut,
    ModelChoice,
    StreamOut,
)
from app.service import jobs
from app.service.shadows import compared
from app.service.streams import described, stream_page
from app.storage.models import Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import streams as stream_repo
from app.streams.stale import STALE
from app.web.access import (
    PageReader,
    SameSite,
    holds,
    remember_token,
)
from app.web.acting import token_refusal
from app.web.rendering import (
    PAGE_SIZE,
    RECENT_ALARMS,
    age,
    missing,
    model_label,
    named,
    render,
    state_of,
)

router = APIRouter(include_in_schema=False, dependencies=[SingleQueryValues])


@router.get("/", response_class=HTMLResponse, dependencies=[PageReader])
def streams_page(
    request: Request,
    session: SessionDep,
    state: StateDep,
    q: Annotated[str | None, Query(max_length=128)] = None,
    cursor: CursorQuery = None,
) -> Response:
    prefix = (q or "").strip() or None
    page = stream_page(session, state, limit=PAGE_SIZE, cursor=cursor, prefix=prefix)
    rows = [
        {**_facts(stream), "alarms": [a for a in stream.open_alarms if a.detector != STALE]}
        for stream in page.items
    ]
    return render(
        request,
        "streams.html",
        {"rows": rows, "q": prefix or "", "next_cursor": page.next_cursor, "cursor": cursor},
    )


def _facts(stream: StreamOut) -> dict[str, Any]:
    return {
        "stream": stream,
        "state": state_of(stream),
        "model": model_label(stream),
        "seen": age(stream.last_t, datetime.now(UTC)),
    }


def _stream(session: Session, stream_id: str) -> Stream | None:
    return stream_repo.get(session, stream_id) if named(stream_id) else None


@router.get("/streams/{stream_id}", response_class=HTMLResponse, dependencies=[PageReader])
def stream_detail(
    request: Request,
    stream_id: str,
    session: SessionDep,
    state: StateDep,
    at: Annotated[float | None, Query(ge=0, le=1e11, description="Epoch seconds")] = None,
) -> Response:
    row = _stream(session, stream_id)
    if row is None:
        return missing(request, f"No stream “{stream_id}”.")
    return _stream_page(request, session, state, row, at=at)


def _stream_page(
    request: Request,
    session: Session,
    state: AppState,
    row: Stream,
    *,
    at: float | None = None,
    problem: str | None = None,
    code: int = 200,
) -> Response:
    recent = alarm_repo.page(session, stream_id=row.id, limit=RECENT_ALARMS).items
    stream = described(state, session, row)
    relearning = next(
        (
            job
            for job in job_repo.page(session, stream_id=row.id, limit=20, before=None)
            if job.kind == "retrain"
        ),
        None,
    )
    offered = None  # the version that job made, if no stream has run it yet
    if relearning is not None and relearning.phase == "succeeded" and relearning.result:
        made = version_repo.get(
            session, relearning.result["name"], int(relearning.result["version"])
        )
        if made is not None and made.status == "candidate":
            offered = relearning.result
    since = min((alarm.opened_at for alarm in stream.open_alarms), default=None)
    return render(
        request,
        "stream.html",
        {
            **_facts(stream),
            "alarms": [AlarmOut.of(alarm) for alarm in recent],
            "shadow": version_repo.shadow_of(session, row.id),
            "at": at,
            "relearning": None if relearning is None else JobOut.of(relearning),
            "offered": offered,
            "since": "" if since is None else since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
            "token_needed": not holds(request, state.settings.write_tokens()),
            "problem": problem,
        },
        code,
    )


StreamChange = Callable[[], Response | None]
"""A page's change to a stream: None when it was made, or the response that refuses it."""


def _change_stream(
    request: Request,
    session: Session,
    state: AppState,
    stream_id: str,
    token: str,
    doing: str,
    change: StreamChange,
) -> Response:
    """A change a stream page's form asks for (`doing`: what it is, for a refusal): made with
    the API token the service requires, if any, then back to the stream's page; a refusal
    answers the page with the reason (an API refusal's own detail)."""
    row = _stream(session, stream_id)
    if row is None:
        return missing(request, f"No stream “{stream_id}”.")
    given = token.strip()
    refusal = token_refusal(request, state.settings, given, doing)
    if refusal is not None:
        return _stream_page(request, session, state, row, problem=refusal, code=401)
    try:
        refused = change()
    except AppError as exc:
        session.rollback()  # nothing of a refused change is kept, as the API's answer
        return _stream_page(request, session, state, row, problem=exc.detail, code=exc.status)
    if refused is not None:
        detail = json.loads(bytes(refused.body)).get("detail", f"{doing} was refused")
        return _stream_page(request, session, state, row, problem=detail, code=refused.status_code)
    address = f"{request.url_for('stream_detail', stream_id=stream_id).path}#new-normal"
    response = RedirectResponse(address, status_code=status.HTTP_303_SEE_OTHER)
    if given:
        remember_token(request, response, given)
    return response


@router.post(
    "/streams/{stream_id}/new-normal",
    response_class=HTMLResponse,
    dependencies=[SameSite, PageReader],
)
def confirm_new_normal(
    request: Request,
    stream_id: str,
    session: SessionDep,
    state: StateDep,
    since: Annotated[str, Form(max_length=64)] = "",
    token: Annotated[str, Form(max_length=1000)] = "",
) -> Response:
    """An operator confirms that the stream's readings since `since` (UTC) are its new normal:
    a retrain job learns the stream afresh from them, as `POST /v1/streams/{id}/jobs` does;
    the page then offers to run the version it makes."""

    def queue() -> Response | None:
        try:
            moment = datetime.fromisoformat(since.strip())
            body = JobIn(kind="retrain", since=moment.replace(tzinfo=moment.tzinfo or UTC))
        except (ValueError, ValidationError):
            raise DataError(
                "Give the moment the new normal began, as a date and time (UTC)."
            ) from None
        jobs.queue(state, session, stream_id, body)
        return None

    return _change_stream(request, session, state, stream_id, token, "Learning a new normal", queue)


@router.post(
    "/streams/{stream_id}/run",
    response_class=HTMLResponse,
    dependencies=[SameSite, PageReader],
)
def run_version(
    request: Request,
    stream_id: str,
    session: SessionDep,
    state: StateDep,
    name: Annotated[str, Form(max_length=300)] = "",
    version: Annotated[str, Form(max_length=20)] = "",
    token: Annotated[str, Form(max_length=1000)] = "",
) -> Response:
    """Run the version a new normal's job made, as `POST /v1/streams/{id}/model` does."""

    def switch() -> Response | None:
        try:
            choice = ModelChoice(name=name, version=int(version))
        except (ValueError, ValidationError):
            raise DataError("There is no such version to run.") from None
        answer = switch_model(stream_id, choice, session, state)
        # (Forwarded to the worker that holds the stream, its refusal is a response.)
        return answer if isinstance(answer, Response) and answer.status_code >= 400 else None

    return _change_stream(request, session, state, stream_id, token, "Running a version", switch)


@router.get("/streams/{stream_id}/facts", response_class=HTMLResponse, dependencies=[PageReader])
def stream_facts(
    request: Request, stream_id: str, session: SessionDep, state: StateDep
) -> Response:
    """The stream page's summary alone, which the page fetches again to follow the stream."""
    row = _stream(session, stream_id)
    if row is None:
        return missing(request, f"No stream “{stream_id}”.")
    return render(request, "stream_facts.html", _facts(described(state, session, row)))


@router.get("/streams/{stream_id}/shadow", response_class=HTMLResponse, dependencies=[PageReader])
def shadow_page(request: Request, stream_id: str, session: SessionDep, state: StateDep) -> Response:
    """The comparison `GET /v1/streams/{id}/shadow` answers, on a page of its own: it replays
    both versions over the readings since the shadow started, too costly to do at every view
    of the stream's page."""
    row = _stream(session, stream_id)
    shadow = None if row is None else version_repo.shadow_of(session, stream_id)
    if row is None or shadow is None:
        return missing(request, f"No stream “{stream_id}” with a shadowing candidate.")
    try:
        comparison, problem = compared(state, session, row, shadow), None
    except AppError as error:  # its version was deleted, or cannot run on this stream
        comparison, problem = None, error.detail
    return render(
        request,
        "shadow.html",
        {"stream": row, "shadow": shadow, "comparison": comparison, "problem": problem},
    )
