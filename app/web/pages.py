"""The operator's pages, served by the service itself: server-rendered HTML (Jinja2 templates
beside this file) readable without a script, a stylesheet of our own and, for the chart, uPlot
(`static/vendor/`); nothing is fetched from elsewhere.

- `/` the streams, a page at a time (the query of `GET /v1/streams`);
- `/streams/{id}` one stream: its live chart (drawn by `static/stream.js` from
  `GET /v1/streams/{id}/readings` and `GET /v1/alarms`), settings, model, detectors and alarms;
  `/streams/{id}/shadow` the comparison with a shadowing candidate (replayed on demand);
  `/streams/{id}/new-normal` and `/streams/{id}/run` an operator's confirmation that a
  learned stream's process has a new normal (a retrain job from then on), and running the
  version it made;
- `/alarms` alarms across streams, filtered, each acknowledged with a name;
- `/incidents` incidents (the alarms of one fault together), open and recent, each with its
  alarms, its moment on the chart, acknowledged with a name, and the way to a new normal;
- `/sign-in` when reads are protected (`access.py` says how the token is kept)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Form, Path, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.api.deps import (
    AppState,
    SessionDep,
    SettingsDep,
    SingleQueryValues,
    StateDep,
    token_accepted,
    utcnow,
)
from app.api.jobs import create_job
from app.api.queries import CursorQuery
from app.api.shadows import compared
from app.api.streams import switch_model
from app.errors import AppError, DataError
from app.monitoring.detectors import DETECTORS
from app.registry import AUTO, NAME_PATTERN, learned_name
from app.schemas import (
    AcknowledgeIn,
    AlarmOut,
    IncidentOut,
    JobIn,
    JobOut,
    ModelChoice,
    StreamOut,
)
from app.service.streams import described, stream_page
from app.settings import Settings
from app.storage.models import Alarm, Incident, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import incidents as incident_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import streams as stream_repo
from app.streams.stale import STALE
from app.web.access import (
    NAME_COOKIE,
    SECURITY_HEADERS,
    ForeignFormError,
    PageReader,
    SameSite,
    SignInRequiredError,
    forget,
    here,
    holds,
    local,
    reader_tokens,
    remember,
    remember_token,
    remembered_name,
    signed_in,
)

HERE = FilePath(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
static = StaticFiles(directory=HERE / "static")

router = APIRouter(include_in_schema=False, dependencies=[SingleQueryValues])

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
    refusal = _token_refusal(request, state.settings, given, doing)
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
        create_job(stream_id, body, session, state, Response())
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


AlarmStateFilter = Literal["open", "closed", ""]


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


@dataclass(frozen=True)
class Refusal:
    """Why the page did not acknowledge an alarm or an incident (`subject`: "Alarm 12"), shown
    above the list (with the name the form gave, to try again)."""

    status: int
    subject: str
    message: str
    name: str


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
    who = _who(
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
    return _acknowledged(request, back, alarm_id, who, given)


def _acknowledged(request: Request, back: str, number: int, who: str, given: str) -> Response:
    """Back to the list, saying what was acknowledged; the name (and a token given) kept."""
    response = RedirectResponse(
        with_acknowledged(back, number), status_code=status.HTTP_303_SEE_OTHER
    )
    if given:
        remember_token(request, response, given)
    remember(request, response, NAME_COOKIE, who)
    return response


def with_acknowledged(back: str, alarm_id: int) -> str:
    """The page to return to, saying which alarm was just acknowledged (in place of the one
    it said before)."""
    parts = urlsplit(back)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key != "acknowledged"]
    return f"{parts.path}?{urlencode([*query, ('acknowledged', str(alarm_id))])}"


def _who(
    request: Request,
    settings: Settings,
    subject: str,
    exists: Callable[[], bool],
    by: str,
    given: str,
) -> str | Refusal:
    """Who acknowledges `subject`, or why not (the token first: whether it exists is for those
    who may acknowledge it)."""
    refusal = _token_refusal(request, settings, given, "Acknowledging")
    if refusal is not None:
        return Refusal(401, subject, refusal, by)
    if not exists():
        return Refusal(404, subject, f"There is no {subject[0].lower()}{subject[1:]}.", by)
    try:
        return AcknowledgeIn(by=by).by
    except ValidationError:
        message = "Give a name of 1 to 128 characters (yours or a system's) to acknowledge."
        return Refusal(422, subject, message, by[:128])


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
    who = _who(
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
    return _acknowledged(request, back, incident_id, who, given)


def _token_refusal(request: Request, settings: Settings, given: str, doing: str) -> str | None:
    """Why a page's change is refused for want of the API token the service requires (`doing`:
    what the change is), or None."""
    needed = settings.write_tokens()
    if needed is None:
        return None
    if given and not token_accepted(given, needed):
        return "That is not this service's API token: nothing was changed."
    if not given and not holds(request, needed):
        return (
            f"{doing} needs this service's API token (TWINWATCH_API_TOKEN): enter it in the "
            "form. It is kept for this browser session only."
        )
    return None


@router.get("/sign-in", response_class=HTMLResponse)
def sign_in_page(request: Request, back: Annotated[str, Query(max_length=2000)] = "/") -> Response:
    return render(request, "sign_in.html", {"back": local(back), "problem": None})


@router.post("/sign-in", response_class=HTMLResponse, dependencies=[SameSite])
def sign_in(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    back: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    accepted = reader_tokens(settings)
    target = local(back)
    given = token.strip()
    if accepted is not None and not (given and token_accepted(given, accepted)):
        problem = "Enter this service's token." if not given else "That token is not accepted."
        return render(request, "sign_in.html", {"back": target, "problem": problem}, 401)
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    if given:
        remember_token(request, response, given)
    return response


@router.post("/sign-out", response_class=HTMLResponse, dependencies=[SameSite])
def sign_out() -> Response:
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    forget(response)
    return response


async def _sign_in_required(request: Request, exc: Exception) -> Response:
    back = exc.back if isinstance(exc, SignInRequiredError) else "/"
    return render(request, "sign_in.html", {"back": local(back), "problem": None}, 401)


async def _foreign_form(request: Request, exc: Exception) -> Response:
    message = "This form was sent from another site: refused. Use the page on this service."
    return render(request, "missing.html", {"what": message}, 403)


def install(app: FastAPI) -> None:
    """The pages, their static files and their answers to a reader not signed in."""
    app.include_router(router)
    app.mount("/static", static, name="static")
    app.add_exception_handler(SignInRequiredError, _sign_in_required)
    app.add_exception_handler(ForeignFormError, _foreign_form)
