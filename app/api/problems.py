"""Every error as RFC 9457 problem JSON, and the request-body size limit.

One handler per error family: `AppError` (ours), request validation (pydantic), HTTP errors
raised by the router (404 route, 405 method, 413 body), and anything unexpected (a bug: 500,
logged, no internals leaked).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import STATE_KEY
from app.errors import (
    AppError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthorizedError,
)
from app.logs import REQUEST_ID_HEADER, current_request_id
from app.schemas import PROBLEM_MEDIA_TYPE
from app.storage.db import UNAVAILABLE, DatabaseError

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://twinwatch.dev/problems/"


def problem_response(
    *,
    status: int,
    title: str,
    detail: str,
    slug: str,
    instance: str | None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


# HTTP errors raised by the router speak the same vocabulary as our own errors.
_KNOWN: dict[int, tuple[str, str]] = {
    cls.status: (cls.type_slug, cls.title)
    for cls in (NotFoundError, ConflictError, PayloadTooLargeError, UnauthorizedError)
}


def _slug_and_title(status: int) -> tuple[str, str]:
    if status in _KNOWN:
        return _KNOWN[status]
    phrase = HTTPStatus(status).phrase
    return phrase.lower().replace(" ", "-").replace("'", ""), phrase


RETRY_AFTER_S = 5
"""What a 503 asks a client to wait before it sends again (Retry-After, seconds)."""


async def app_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AppError)
    headers = None
    if exc.status == HTTPStatus.UNAUTHORIZED:
        headers = {"WWW-Authenticate": "Bearer"}
    elif exc.status == HTTPStatus.SERVICE_UNAVAILABLE:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(
        exc.problem(instance=request.url.path),
        status_code=exc.status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    malformed = [error for error in errors if error.get("type") == "json_invalid"]
    if malformed:
        message = malformed[0].get("ctx", {}).get("error", "invalid JSON")
        return problem_response(
            status=HTTPStatus.BAD_REQUEST,
            title="Malformed JSON",
            detail=f"the request body is not valid JSON: {message}",
            slug="malformed-json",
            instance=request.url.path,
        )
    fields = [
        {
            "field": _field_path(tuple(error.get("loc", ()))),
            "message": str(error.get("msg", "")),
            "type": str(error.get("type", "")),
        }
        for error in errors
    ]
    summary = "; ".join(f"{item['field']}: {item['message']}" for item in fields[:5])
    more = f" (and {len(fields) - 5} more)" if len(fields) > 5 else ""
    return problem_response(
        status=HTTPStatus.UNPROCESSABLE_ENTITY,
        title="Invalid request",
        detail=f"{len(fields)} invalid field(s): {summary}{more}",
        slug="validation-error",
        instance=request.url.path,
        errors=fields,
    )


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else {}
    if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        headers["Allow"] = ", ".join(_allowed(request))
        exc = HTTPException(exc.status_code, exc.detail, headers)
    slug, title = _slug_and_title(exc.status_code)
    phrase = HTTPStatus(exc.status_code).phrase
    detail = exc.detail if exc.detail and exc.detail != phrase else _default_detail(exc, request)
    return problem_response(
        status=exc.status_code,
        title=title,
        detail=str(detail),
        slug=slug,
        instance=request.url.path,
        headers=headers or None,
    )


def _allowed(request: Request) -> list[str]:
    """Every method some route of the path answers: the router stops at the first route of
    the path, whose `Allow` names its own methods only (a stream's PUT, not its GET)."""
    methods = {
        method
        for method in ("DELETE", "GET", "PATCH", "POST", "PUT")
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    }
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def _default_detail(exc: HTTPException, request: Request) -> str:
    if exc.status_code == HTTPStatus.NOT_FOUND:
        return f"no endpoint at {request.url.path}"
    if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        allowed = (exc.headers or {}).get("Allow", "")
        return f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    return HTTPStatus(exc.status_code).description


async def database_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """The database could not be reached or gave up mid-transaction: nothing of the request was
    stored (its transaction rolled back), so a client can send it again."""
    state = getattr(request.state, STATE_KEY, None)
    if state is not None:
        state.database.outage.failed(f"{request.method} {request.url.path}", exc)
    error = DatabaseError(
        f"the database is unavailable ({type(exc).__name__}); nothing was stored, it is safe "
        "to re-send"
    )
    return await app_error_handler(request, error)


async def client_gone_handler(request: Request, exc: Exception) -> Response:
    """The client hung up before its body was read: no one to answer, nothing stored. One line
    (a flood of hang-ups must not flood the log with tracebacks)."""
    log.info(
        "client disconnected during %s %s before its body was read",
        request.method,
        request.url.path,
    )
    return Response(status_code=HTTPStatus.BAD_REQUEST)  # nobody reads it


async def unexpected_error_handler(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    # Starlette answers a 500 outside every middleware: RequestIdMiddleware cannot add its header.
    request_id = current_request_id.get()
    return problem_response(
        status=HTTPStatus.INTERNAL_SERVER_ERROR,
        title="Internal server error",
        detail="an unexpected error occurred; it has been logged",
        slug="internal-error",
        instance=request.url.path,
        headers={REQUEST_ID_HEADER: request_id} if request_id is not None else None,
    )


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(AppError, app_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)
    for outage in UNAVAILABLE:
        app.add_exception_handler(outage, database_error_handler)
    app.add_exception_handler(ClientDisconnect, client_gone_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)


class BodySizeLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413, whether announced or streamed.

    A declared Content-Length over the limit is answered before the body is read. A body that
    exceeds the limit while streaming (chunked, or a lying header) makes `receive` raise an
    HTTPException(413), which the router passes through to the problem handler.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            error = PayloadTooLargeError(
                f"the request body ({declared} bytes) exceeds {self.max_bytes} bytes"
            )
            response = JSONResponse(
                error.problem(instance=scope.get("path")),
                status_code=error.status,
                media_type=PROBLEM_MEDIA_TYPE,
            )
            await response(scope, receive, send)
            return

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        detail=f"the request body exceeds {self.max_bytes} bytes",
                    )
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
