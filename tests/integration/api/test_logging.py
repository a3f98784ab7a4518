"""Every line logged while handling a request names it; the response returns its id."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.logs import UVICORN_LOGGERS, configure_logging
from app.settings import Settings
from tests.integration.conftest import AppFactory

LogTo = Callable[[Literal["text", "json"]], io.StringIO]


@pytest.fixture
def log_to() -> Iterator[LogTo]:
    """`log_to(format)` configures logging into the string it returns; the test runner's
    logging comes back afterwards."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in UVICORN_LOGGERS)]
    saved = [(logger, logger.level, logger.handlers[:], logger.propagate) for logger in loggers]

    def configure(log_format: Literal["text", "json"]) -> io.StringIO:
        stream = io.StringIO()
        configure_logging(Settings(log_format=log_format, log_level="info"), stream=stream)
        return stream

    yield configure
    logging.captureWarnings(False)
    for logger, level, handlers, propagate in saved:
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.fixture
def logging_client(make_client: AppFactory) -> TestClient:
    """An app with a route that logs from the thread pool, as the sync handlers do."""
    client = make_client()
    app = client.app
    assert isinstance(app, FastAPI)

    @app.get("/log")
    def log_something() -> dict[str, str]:
        logging.getLogger("app.test").info("handling %s", "it")
        return {}

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    return client


def json_lines(stream: io.StringIO, logger: str) -> list[dict[str, Any]]:
    """The lines of `logger` (httpx, under the test client, logs each request too)."""
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in lines if line["logger"] == logger]


def test_json_lines_carry_the_request_id(logging_client: TestClient, log_to: LogTo) -> None:
    stream = log_to("json")
    logging.getLogger("app.test").info("outside any request")
    sent = logging_client.get("/log", headers={"X-Request-ID": "gw-42.7"})
    made = logging_client.get("/log")

    outside, first, second = json_lines(stream, "app.test")
    assert set(outside) == {"time", "level", "logger", "message"}  # no request, no id
    assert first == {
        "time": first["time"],
        "level": "INFO",
        "logger": "app.test",
        "message": "handling it",
        "request_id": "gw-42.7",
    }
    assert first["time"].endswith("+00:00")
    assert second["request_id"] == made.headers["X-Request-ID"]
    assert sent.headers["X-Request-ID"] == "gw-42.7"


def test_a_500_is_logged_and_answered_with_its_request_id(
    logging_client: TestClient, log_to: LogTo
) -> None:
    stream = log_to("json")
    client = TestClient(logging_client.app, raise_server_exceptions=False)
    response = client.get("/boom", headers={"X-Request-ID": "boom-1"})
    assert response.status_code == 500
    assert response.headers["X-Request-ID"] == "boom-1"
    (line,) = json_lines(stream, "app.api.problems")
    assert line["request_id"] == "boom-1"
    assert line["level"] == "ERROR"
    assert "RuntimeError: a bug" in line["exception"]


def test_text_lines_show_the_request_id(logging_client: TestClient, log_to: LogTo) -> None:
    stream = log_to("text")
    logging.getLogger("app.test").info("outside any request")
    logging_client.get("/log", headers={"X-Request-ID": "abc"})
    outside, inside = [line for line in stream.getvalue().splitlines() if " app.test " in line]
    assert outside.endswith(" INFO app.test [-]: outside any request")
    assert inside.endswith(" INFO app.test [abc]: handling it")


def test_a_request_gets_its_x_request_id_back(make_client: AppFactory) -> None:
    client = make_client(max_body_bytes=1024)
    # Problems too, even the 413 answered before the app reads the body.
    for method, url, body, status in [
        ("GET", "/healthz", None, 200),
        ("PUT", "/v1/streams/x", b"{", 400),
        ("PUT", "/v1/streams/x", b"{" * 2000, 413),
        ("GET", "/nowhere", None, 404),
    ]:
        headers = {"X-Request-ID": f"req-{status}", "Content-Type": "application/json"}
        response = client.request(method, url, content=body, headers=headers)
        assert response.status_code == status
        assert response.headers["X-Request-ID"] == f"req-{status}"


@pytest.mark.parametrize(
    "incoming",
    [None, b"", b"two words", b"x" * 129, b"tab\tbreak", b'quote"d', "caf\u00e9".encode()],
    ids=["absent", "empty", "space", "too-long", "tab", "quote", "non-ascii"],
)
def test_a_missing_or_insane_request_id_is_replaced(
    client: TestClient, incoming: bytes | None
) -> None:
    headers = {} if incoming is None else {"X-Request-ID": incoming}
    returned = client.get("/healthz", headers=headers).headers["X-Request-ID"]
    assert returned.encode() != incoming
    assert len(returned) == 32 and int(returned, 16) >= 0
    assert client.get("/healthz", headers=headers).headers["X-Request-ID"] != returned
