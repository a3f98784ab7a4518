"""Every kind of bad request gets an RFC 9457 problem answer, never a 500."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from tests.integration.conftest import AppFactory

PROBLEM = "application/problem+json"
PROBLEM_KEYS = {"type", "title", "status", "detail", "instance"}


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.json()
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["type"] == f"https://twinwatch.dev/problems/{slug}"
    return body


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.put(
        "/v1/streams/pump-1",
        content=b'{"channels": [',
        headers={"content-type": "application/json"},
    )
    body = assert_problem(response, 400, "malformed-json")
    assert body["title"] == "Malformed JSON"
    assert body["instance"] == "/v1/streams/pump-1"
    assert client.get("/v1/streams/pump-1").status_code == 404


BODY_ENDPOINTS = [
    ("PUT", "/v1/streams/pump-1"),
    ("POST", "/v1/streams/pump-1/readings"),
    ("POST", "/v1/readings"),
    ("POST", "/v1/alarms/1/acknowledge"),
    ("POST", "/v1/incidents/1/acknowledge"),
    ("POST", "/v1/streams/pump-1/jobs"),
    ("POST", "/v1/streams/pump-1/model"),
    ("PUT", "/v1/streams/pump-1/shadow"),
]


@pytest.mark.parametrize(("method", "url"), BODY_ENDPOINTS)
def test_every_body_endpoint_answers_malformed_json_with_400(
    client: TestClient, method: str, url: str
) -> None:
    response = client.request(
        method, url, content=b'{"by": ', headers={"content-type": "application/json"}
    )
    assert_problem(response, 400, "malformed-json")


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser's recursion limit
        b'{"model": "\xff"}',  # not UTF-8
        b'{"sample_period_s": 1' + b"0" * 5000 + b"}",  # a number out of any float's range
    ],
    ids=["deep", "not-utf8", "huge-number"],
)
@pytest.mark.parametrize(("method", "url"), BODY_ENDPOINTS)
def test_unparseable_bodies_are_one_problem_everywhere(
    client: TestClient, body: bytes, method: str, url: str
) -> None:
    """One parser for every body, so one answer: a body nested past the parser's limit is
    malformed JSON on a stream's PUT as on its readings."""
    response = client.request(
        method, url, content=body, headers={"content-type": "application/json"}
    )
    assert_problem(response, 400, "malformed-json")
    assert client.get("/v1/streams/pump-1").status_code == 404


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"", {}),
        (b"null", {"content-type": "application/json"}),
        (b"{}", {"content-type": "text/plain"}),
    ],
    ids=["empty", "null", "not-json-content-type"],
)
def test_missing_or_non_object_bodies_are_422(
    client: TestClient, content: bytes, headers: dict[str, str]
) -> None:
    response = client.put("/v1/streams/pump-1", content=content, headers=headers)
    body = assert_problem(response, 422, "validation-error")
    assert body["errors"][0]["field"] == "body"


def test_a_bug_is_a_500_problem_without_internals(make_client: AppFactory) -> None:
    client = make_client()

    @client.app.get("/boom")  # type: ignore[attr-defined, misc]
    def boom() -> None:
        raise RuntimeError("secret internal detail")

    response = TestClient(client.app, raise_server_exceptions=False).get("/boom")
    body = assert_problem(response, 500, "internal-error")
    assert "secret" not in response.text
    assert body["detail"] == "an unexpected error occurred; it has been logged"


def test_wrong_types_are_422_with_fields(client: TestClient) -> None:
    response = client.put("/v1/streams/pump-1", json={"channels": "value", "sample_period_s": "x"})
    body = assert_problem(response, 422, "validation-error")
    errors = body["errors"]
    assert isinstance(errors, list)
    assert {error["field"] for error in errors} == {"body.channels", "body.sample_period_s"}
    assert all(error["message"] and error["type"] for error in errors)
    not_an_object = client.put("/v1/streams/pump-1", json=[1, 2])
    assert_problem(not_an_object, 422, "validation-error")


def test_unknown_stream_is_404(client: TestClient) -> None:
    body = assert_problem(client.get("/v1/streams/ghost"), 404, "not-found")
    assert body["detail"] == "stream 'ghost' does not exist"
    assert body["stream"] == "ghost"


def test_unknown_route_and_wrong_method(client: TestClient) -> None:
    body = assert_problem(client.get("/v2/nothing"), 404, "not-found")
    assert body["detail"] == "no endpoint at /v2/nothing"
    wrong = client.patch("/v1/streams/pump-1", json={})
    body = assert_problem(wrong, 405, "method-not-allowed")
    assert "PATCH is not allowed" in str(body["detail"])
    # Every method of the path, though a stream's PUT, GET and DELETE are separate routes.
    assert wrong.headers["allow"] == "DELETE, GET, HEAD, PUT"
    assert "DELETE, GET, HEAD, PUT" in str(body["detail"])
    assert client.options("/v1/streams/x").headers["allow"] == "DELETE, GET, HEAD, PUT"


@pytest.fixture
def small_body_client(make_client: AppFactory) -> Iterator[TestClient]:
    yield make_client(max_body_bytes=2048)


def test_oversize_body_is_413_when_announced(small_body_client: TestClient) -> None:
    big = b'{"channels": ["' + b"v" * 4000 + b'"]}'
    response = small_body_client.put(
        "/v1/streams/pump-1", content=big, headers={"content-type": "application/json"}
    )
    body = assert_problem(response, 413, "payload-too-large")
    assert "exceeds 2048 bytes" in str(body["detail"])
    assert small_body_client.get("/v1/streams/pump-1").status_code == 404


def test_oversize_body_is_413_when_streamed(small_body_client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"channels": ["'
        for _ in range(10):
            yield b"v" * 500
        yield b'"]}'

    # A generator body is sent chunked, without Content-Length: the limit counts as it reads.
    response = small_body_client.put(
        "/v1/streams/pump-1", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(response, 413, "payload-too-large")
    assert small_body_client.get("/v1/streams/pump-1").status_code == 404
    # A body under the limit still works.
    assert small_body_client.put("/v1/streams/pump-1", json={}).status_code == 201


def test_openapi_documents_the_api(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path, method in [
        ("/v1/streams/{stream_id}", "put"),
        ("/v1/streams/{stream_id}", "get"),
        ("/v1/streams/{stream_id}", "delete"),
        ("/v1/streams", "get"),
        ("/v1/alarms", "get"),
        ("/v1/alarms/{alarm_id}", "get"),
        ("/v1/alarms/{alarm_id}/acknowledge", "post"),
        ("/v1/models", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], (path, method)
    put = paths["/v1/streams/{stream_id}"]["put"]
    assert put["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/StreamOut"
    )
    assert "application/problem+json" in put["responses"]["422"]["content"]
    assert "Problem" in schema["components"]["schemas"]
    # The readings bodies, validated from their bytes, are documented all the same.
    for path, model in [
        ("/v1/streams/{stream_id}/readings", "ReadingsIn"),
        ("/v1/readings", "ManyReadingsIn"),
    ]:
        body = paths[path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["$ref"].endswith(f"/{model}")
        assert model in schema["components"]["schemas"]
    many = schema["components"]["schemas"]["ManyReadingsIn"]
    assert many["properties"]["streams"]["items"]["$ref"].endswith("/StreamReadingsIn")
    assert {"StreamReadingsIn", "ReadingIn"} <= set(schema["components"]["schemas"])


def test_a_client_gone_mid_body_is_one_log_line_not_a_500(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up while sending its body: nothing to answer, nothing stored, and
    one line in the log (not an unhandled error with its tracebacks)."""
    assert client.put("/v1/streams/pump-1", json={}).status_code == 201
    sent: list[dict[str, Any]] = []
    parts = [
        {"type": "http.request", "body": b'{"readings": [{"t": 1767225600, ', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return parts.pop(0) if parts else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/streams/pump-1/readings",
        "raw_path": b"/v1/streams/pump-1/readings",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"4000")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": dict(client.app_state),
    }
    caplog.clear()
    with caplog.at_level(logging.INFO):
        anyio.run(client.app, scope, receive, send)  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert [r for r in caplog.records if "disconnected" in r.getMessage()]
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert all(status < 500 for status in statuses), statuses
    assert client.get("/v1/streams/pump-1").json()["samples_seen"] == 0


def test_a_query_parameter_given_twice_is_refused(client: TestClient) -> None:
    """Not settled by taking one of the values: the caller meant something else."""
    answer = client.get("/v1/alarms?stream=a&stream=b")
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["detail"] == "query parameter 'stream' is given 2 times: give it once"
    assert client.get("/v1/alarms?stream=a&limit=5").status_code == 200
