"""The app's state and the typed dependencies routers declare (`SessionDep`, `StateDep`, ...)."""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import unquote

import anyio
from fastapi import Depends, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from app.bus.jetstream import Bus
from app.errors import DataError, UnauthorizedError
from app.metrics import Metrics
from app.registry import ModelRegistry
from app.schemas import PROBLEM_MEDIA_TYPE
from app.service.engine import ServiceState
from app.settings import Settings


@dataclass
class AppState(ServiceState):
    """What the lifespan opens and every request may use: the service's state, and the bus an
    API process forwards to. One per app, never global."""

    bus: Bus | None = None  # with TWINWATCH_BUS_URL: readings go to the workers through it


STATE_KEY = "twinwatch"  # the key `app.main.LifespanState` yields


# The cheap dependencies are `async def` on purpose: FastAPI runs a plain `def` dependency in
# its thread pool, a hop on every request that work this small does not need.
async def get_state(request: Request) -> AppState:
    state = getattr(request.state, STATE_KEY, None)
    if not isinstance(state, AppState):
        raise RuntimeError("the app's lifespan has not run: use create_app() under a server")
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_settings(state: StateDep) -> Settings:
    return state.settings


async def get_registry(state: StateDep) -> ModelRegistry:
    return state.registry


async def get_metrics(state: StateDep) -> Metrics:
    return state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


async def get_session(state: StateDep) -> AsyncIterator[Session]:
    """One unit of work per request: committed when the handler returns, rolled back if it
    raises. Function scope makes the commit happen before the response is sent, so a 2xx
    answer means the changes are durable.

    `async`, with the commit (which waits on the disk) run in a worker thread: opening a session
    touches no database, and a plain generator would cost every request two thread hand-offs.
    A handler that writes on the hot path (ingest) commits itself, in its own thread, before it
    answers: then there is nothing left to commit here, and no hand-off at all."""
    session = state.database.sessions()
    try:
        yield session
        if session.in_transaction():
            await anyio.to_thread.run_sync(session.commit)
        state.database.outage.answered()
    except BaseException:
        await anyio.to_thread.run_sync(session.rollback)
        raise
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def utcnow() -> datetime:
    return datetime.now(UTC)


bearer_auth = HTTPBearer(
    scheme_name="bearerAuth",
    description="The server's TWINWATCH_API_TOKEN (writes need it when one is set), or for "
    "reads its TWINWATCH_READ_TOKEN when reads are protected.",
    auto_error=False,  # a missing token is answered by `require_token`, as problem JSON
)
"""Declares the security scheme in OpenAPI (Swagger UI's Authorize button) and reads the header."""

BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_auth)]


def check_token(credentials: str | None, accepted: list[str]) -> None:
    """UnauthorizedError unless `credentials` (a bearer token, None: no header) is one of
    `accepted` (compared in constant time)."""
    if credentials is None:
        raise UnauthorizedError("this endpoint needs an 'Authorization: Bearer <token>' header")
    if not token_accepted(credentials, accepted):
        raise UnauthorizedError("the bearer token is not valid")


def token_accepted(given: str, accepted: list[str]) -> bool:
    """Whether `given` is one of `accepted`, compared in constant time (each one compared)."""
    presented = given.encode()
    return any([hmac.compare_digest(presented, token.encode()) for token in accepted])


def _credentials(bearer: HTTPAuthorizationCredentials | None) -> str | None:
    return None if bearer is None else bearer.credentials


SESSION_COOKIE = "twinwatch_token"
"""The operator's pages keep the token given once (to sign in, or to acknowledge) in this
cookie for the browser session: HttpOnly, SameSite=Strict, never in a URL. Reads accept it
as they accept a bearer token, so the pages' charts fetch the API with it; API writes do not
(a page acknowledges through its own form, which checks where the request comes from)."""


def session_token(cookies: dict[str, str]) -> str | None:
    value = cookies.get(SESSION_COOKIE)
    return unquote(value) if value else None


def presented_token(headers: Headers) -> str | None:
    """What a request presents to read: a bearer token, else the pages' session cookie."""
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return session_token(cookie_parser(headers.get("cookie", "")))


async def require_token(settings: SettingsDep, bearer: BearerCredentials) -> None:
    """With an API token configured, a write needs `Authorization: Bearer <token>`."""
    accepted = settings.write_tokens()
    if accepted is not None:
        check_token(_credentials(bearer), accepted)


async def require_read_token(
    request: Request, settings: SettingsDep, bearer: BearerCredentials
) -> None:
    """With reads protected (a read token, or `protect_reads`), a read needs one of them, as a
    bearer token or in the pages' session cookie."""
    accepted = settings.read_tokens()
    if accepted is not None:
        check_token(_credentials(bearer) or session_token(request.cookies), accepted)


WriteAccess = Depends(require_token)
"""Put `dependencies=[WriteAccess]` on every route that changes something."""
ReadAccess = Depends(require_read_token)


async def single_query_values(request: Request) -> None:
    """A query parameter given more than once is refused, not settled by taking one of them:
    no parameter of the API is a list."""
    given = Counter(key for key, _ in request.query_params.multi_items())
    for key, times in given.items():
        if times > 1:
            raise DataError(f"query parameter {key!r} is given {times} times: give it once")


SingleQueryValues = Depends(single_query_values)
"""On every router and route that reads (all but /healthz and /readyz)."""


DOCUMENTS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


class DocumentsAccessMiddleware:
    """The API's documents (Swagger UI, ReDoc, the OpenAPI JSON) need a read token when reads
    are protected: FastAPI serves them outside the routers, so no dependency can guard them."""

    def __init__(self, app: ASGIApp, *, accepted: list[str]) -> None:
        self.app = app
        self.accepted = accepted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in DOCUMENTS:
            try:
                check_token(presented_token(Headers(scope=scope)), self.accepted)
            except UnauthorizedError as exc:
                response = JSONResponse(
                    exc.problem(instance=scope["path"]),
                    status_code=exc.status,
                    headers={"WWW-Authenticate": "Bearer"},
                    media_type=PROBLEM_MEDIA_TYPE,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
