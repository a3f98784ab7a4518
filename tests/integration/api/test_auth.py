"""With an API token, writes need `Authorization: Bearer <token>`; reads stay open unless a
read token (or `protect_reads`) asks for one."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.storage.db import Database
from tests.integration.conftest import AppFactory, make_alarm, make_stream

TOKEN = "s3cret-token-of-32-characters-ok"


@pytest.fixture
def guarded(make_client: AppFactory) -> TestClient:
    return make_client(api_token=TOKEN)


def test_writes_without_the_token_are_401(guarded: TestClient, database: Database) -> None:
    with database.session() as session:
        make_stream(session, "existing")
        alarm_id = make_alarm(session, "existing").id
    attempts = [
        ("PUT", "/v1/streams/pump-1", {}),
        ("DELETE", "/v1/streams/existing", None),
        ("POST", f"/v1/alarms/{alarm_id}/acknowledge", {"by": "mallory"}),
    ]
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        for method, url, body in attempts:
            response = guarded.request(method, url, json=body, headers=headers)
            assert response.status_code == 401, (method, url, headers)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["type"].endswith("/unauthorized")
    # Nothing changed.
    assert guarded.get("/v1/streams/pump-1").status_code == 404
    assert guarded.get("/v1/streams/existing").status_code == 200
    assert guarded.get(f"/v1/alarms/{alarm_id}").json()["acknowledged_by"] is None


def test_writes_with_the_token_succeed(guarded: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert guarded.put("/v1/streams/pump-1", json={}, headers=auth).status_code == 201
    assert guarded.delete("/v1/streams/pump-1", headers=auth).status_code == 204
    # The scheme is case-insensitive and the token may carry surrounding blanks.
    relaxed = {"Authorization": f"bearer  {TOKEN} "}
    assert guarded.put("/v1/streams/pump-1", json={}, headers=relaxed).status_code == 201


def test_reads_need_no_token(guarded: TestClient) -> None:
    for url in ("/v1/streams", "/v1/alarms", "/v1/models", "/healthz", "/metrics"):
        assert guarded.get(url).status_code == 200, url


def test_no_token_configured_means_open_writes(client: TestClient) -> None:
    assert client.put("/v1/streams/pump-1", json={}).status_code == 201


READ_TOKEN = "a-read-only-token-for-dashboards"
READS = ("/v1/streams", "/v1/alarms", "/v1/incidents", "/v1/models", "/metrics")
DOCUMENTS = ("/docs", "/redoc", "/openapi.json")


def test_with_a_read_token_reads_need_it_or_the_api_token(make_client: AppFactory) -> None:
    guarded = make_client(api_token=TOKEN, read_token=READ_TOKEN)
    reader = {"Authorization": f"Bearer {READ_TOKEN}"}
    writer = {"Authorization": f"Bearer {TOKEN}"}
    for url in READS + DOCUMENTS:
        for headers in ({}, {"Authorization": "Bearer wrong-wrong-wrong-wrong"}):
            answer = guarded.get(url, headers=headers)
            assert answer.status_code == 401, (url, headers)
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.headers["www-authenticate"] == "Bearer"
        assert guarded.get(url, headers=reader).status_code == 200, url
        assert guarded.get(url, headers=writer).status_code == 200, url
    for url in ("/healthz", "/readyz"):  # orchestrators probe without a token
        assert guarded.get(url).status_code == 200
    # The read token reads; it never writes.
    assert guarded.put("/v1/streams/pump-1", json={}, headers=reader).status_code == 401
    assert guarded.put("/v1/streams/pump-1", json={}, headers=writer).status_code == 201
    assert guarded.get("/v1/streams/pump-1", headers=reader).status_code == 200


def test_protect_reads_asks_the_api_token_for_reads(make_client: AppFactory) -> None:
    guarded = make_client(api_token=TOKEN, protect_reads=True)
    assert guarded.get("/v1/streams").status_code == 401
    assert guarded.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert guarded.get("/healthz").status_code == 200
    with pytest.raises(ValueError, match="protect_reads needs api_token"):
        make_client(protect_reads=True)
