"""Alarms over HTTP: filters, cursor pages, one alarm, acknowledgement."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from app.storage.db import Database
from tests.integration.conftest import make_alarm, make_stream


@pytest.fixture
def alarms(database: Database) -> dict[str, int]:
    """pump-1: point alarms at 100, 200, 300, 400 (closed) and 500 (open), a cusum alarm at 250
    (open); pump-2: a point alarm at 150 (closed). Their ids by a short name."""
    ids: dict[str, int] = {}
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
        for sample in (100, 200, 300, 400):
            ids[f"point-{sample}"] = make_alarm(session, "pump-1", sample=sample).id
        ids["point-500"] = make_alarm(session, "pump-1", sample=500, closed_after=None).id
        ids["cusum-250"] = make_alarm(
            session, "pump-1", detector="cusum", sample=250, closed_after=None
        ).id
        ids["other-150"] = make_alarm(session, "pump-2", sample=150).id
    return ids


def samples(response_json: dict[str, object]) -> list[int]:
    items = response_json["items"]
    assert isinstance(items, list)
    return [item["opened_sample"] for item in items]


def test_list_filters(client: TestClient, alarms: dict[str, int]) -> None:
    assert samples(client.get("/v1/alarms").json()) == [500, 400, 300, 250, 200, 150, 100]
    assert samples(client.get("/v1/alarms?stream=pump-2").json()) == [150]
    assert samples(client.get("/v1/alarms?detector=cusum").json()) == [250]
    assert samples(client.get("/v1/alarms?state=open").json()) == [500, 250]
    since = quote("2025-01-01T00:00:20+00:00")
    until = quote("2025-01-01T01:00:40+01:00")  # 00:00:40Z
    window = client.get(f"/v1/alarms?since={since}&until={until}&stream=pump-1").json()
    assert samples(window) == [300, 250, 200]
    # Epoch seconds are accepted too (2025-01-01T00:00:20Z).
    assert samples(client.get("/v1/alarms?since=1735689620&state=closed").json()) == [400, 300, 200]


def test_pages_follow_the_cursor(client: TestClient, alarms: dict[str, int]) -> None:
    seen: list[int] = []
    url = "/v1/alarms?stream=pump-1&limit=2"
    next_cursor = None
    while True:
        page = client.get(url + (f"&cursor={next_cursor}" if next_cursor else "")).json()
        seen += samples(page)
        next_cursor = page["next_cursor"]
        if next_cursor is None:
            break
    assert seen == [500, 400, 300, 250, 200, 100]


def test_one_alarm_and_its_fields(client: TestClient, alarms: dict[str, int]) -> None:
    alarm = client.get(f"/v1/alarms/{alarms['point-100']}").json()
    assert alarm == {
        "id": alarms["point-100"],
        "stream": "pump-1",
        "detector": "point",
        "state": "closed",
        "opened_at": "2025-01-01T00:00:10Z",
        "opened_sample": 100,
        "closed_at": "2025-01-01T00:00:10.500000Z",
        "closed_sample": 105,
        "peak": 1.0,
        "threshold": 0.5,
        "model": "lstm-seed0",
        "model_version": "test",
        "acknowledged_at": None,
        "acknowledged_by": None,
        "incident": None,
        "gaps": None,
        "channels": None,
    }
    missing = client.get("/v1/alarms/999999")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["detail"] == "alarm 999999 does not exist"


def test_acknowledge_once_and_idempotently(client: TestClient, alarms: dict[str, int]) -> None:
    url = f"/v1/alarms/{alarms['point-500']}/acknowledge"
    first = client.post(url, json={"by": "  ana  "})
    assert first.status_code == 200
    assert first.json()["acknowledged_by"] == "ana"
    acknowledged_at = first.json()["acknowledged_at"]
    assert acknowledged_at is not None
    again = client.post(url, json={"by": "bob"})
    assert again.status_code == 200
    assert (again.json()["acknowledged_by"], again.json()["acknowledged_at"]) == (
        "ana",
        acknowledged_at,
    )
    assert client.get(f"/v1/alarms/{alarms['point-500']}").json()["acknowledged_by"] == "ana"
    assert client.post("/v1/alarms/999999/acknowledge", json={"by": "ana"}).status_code == 404


def test_concurrent_acknowledgements_the_first_wins(
    client: TestClient, alarms: dict[str, int]
) -> None:
    """Eight operators acknowledge at once: one of them acknowledged it, and every answer
    (and the stored row) names that one, on either database."""
    names = [f"operator-{i}" for i in range(8)]
    for alarm in (alarms["point-500"], alarms["cusum-250"], alarms["point-100"]):
        start = threading.Barrier(len(names))

        def acknowledge(name: str, alarm: int = alarm, start: threading.Barrier = start) -> str:
            start.wait()
            answer = client.post(f"/v1/alarms/{alarm}/acknowledge", json={"by": name})
            assert answer.status_code == 200
            return str(answer.json()["acknowledged_by"])

        with ThreadPoolExecutor(len(names)) as pool:
            told = set(pool.map(acknowledge, names))
        stored = client.get(f"/v1/alarms/{alarm}").json()["acknowledged_by"]
        assert told == {stored}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=maybe", "query.state"),
        ("limit=0", "query.limit"),
        ("limit=1001", "query.limit"),
        ("since=yesterday", "query.since"),
        ("since=2025-01-01T00:00:00", "query.since"),  # no offset: ambiguous
        ("stream=bad%20id", "query.stream"),
    ],
)
def test_bad_filters_are_422(
    client: TestClient, alarms: dict[str, int], query: str, field: str
) -> None:
    response = client.get(f"/v1/alarms?{query}")
    assert response.status_code == 422
    assert [error["field"] for error in response.json()["errors"]] == [field]


def test_bad_cursor_and_ids(client: TestClient, alarms: dict[str, int]) -> None:
    cursor = client.get("/v1/alarms?cursor=not-a-cursor")
    assert cursor.status_code == 422
    assert "invalid cursor" in cursor.json()["detail"]
    for bad in ("abc", "0", "-3", "99999999999999999999"):
        assert client.get(f"/v1/alarms/{bad}").status_code == 422, bad
    assert client.post(f"/v1/alarms/{alarms['point-100']}/acknowledge", json={}).status_code == 422
    assert (
        client.post(f"/v1/alarms/{alarms['point-100']}/acknowledge", json={"by": "  "}).status_code
        == 422
    )
