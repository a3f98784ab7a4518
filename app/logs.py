"""One log format for the service and uvicorn alike, each line labelled with its request.

`configure_logging(settings)` is called by whatever starts a server (`twinwatch serve`, the demo),
which then hands uvicorn `log_config=None`: uvicorn's loggers (uvicorn, uvicorn.error,
uvicorn.access) keep no handler of their own and reach the root's, so every line has one format,
`text` or `json` (`TWINWATCH_LOG_FORMAT`). `RequestIdMiddleware` gives each request an id that
every line logged while handling it carries, and that the response returns as X-Request-ID.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.settings import Settings

REQUEST_ID_HEADER = "X-Request-ID"
SANE_REQUEST_ID = re.compile(r"[\w.:/+=@-]{1,128}", re.ASCII)
"""An incoming id is kept when it cannot forge or break a log line or a header."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

current_request_id: ContextVar[str | None] = ContextVar("current_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Label a record with the request being handled, if any (on the handler: every logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_id.get()
        if request_id is not None:
            record.request_id = request_id
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, request_id while handling a
    request, and exception (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line["request_id"] = request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def configure_logging(settings: Settings, *, stream: TextIO | None = None) -> None:
    """Route every logger (uvicorn's and Python's warnings included) through one handler on
    `stream` (stderr), in `settings.log_format` at `settings.log_level`."""
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "filters": {"request_id": {"()": RequestIdFilter}},
            "formatters": {
                "text": {
                    "()": logging.Formatter,
                    "fmt": TEXT_FORMAT,
                    "defaults": {"request_id": "-"},
                },
                "json": {"()": JsonFormatter},
            },
            "handlers": {
                "default": {
                    "class": "logging.StreamHandler",
                    "stream": stream if stream is not None else sys.stderr,
                    "formatter": settings.log_format,
                    "filters": ["request_id"],
                }
            },
            "root": {"level": settings.log_level.upper(), "handlers": ["default"]},
            # Undo whatever an earlier uvicorn.Config installed: the root's handler is theirs.
            "loggers": {
                name: {"level": "NOTSET", "handlers": [], "propagate": True}
                for name in UVICORN_LOGGERS
            },
        }
    )
    logging.captureWarnings(True)


class RequestIdMiddleware:
    """Take the request's X-Request-ID if it is sane, else make one; log with it; return it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = incoming if SANE_REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
        # Set and never reset: the server runs each request in a task of its own, so the value
        # ends with it, and it still labels what the 500 handler (outside every middleware)
        # and uvicorn's access log write after the app has raised.
        current_request_id.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)
