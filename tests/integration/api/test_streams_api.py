"""Stream configuration over HTTP: create, update, read, list, delete."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.storage.db import Database
from tests.integration.conftest import T0, make_alarm

PROBLEM = "application/problem+json"


def test_put_creates_then_updates(client: TestClient) -> None:
    created = client.put("/v1/streams/pump-1", json={})
    assert created.status_code == 201
    body = created.json()
    assert body["id"] == "pump-1"
    assert body["model"] == "lstm-seed0"  # the default model
    assert body["channels"] == ["value"]
    assert body["sample_period_s"] == 0.1
    assert body["samples_seen"] == 0
    assert body["open_alarms"] == []
    live = body["live"]
    assert live["warmup_remaining"] == 8  # the fake model's window
    assert live["last_forecast"] is None
    assert live["detectors"]["point"] == {"statistic": None, "threshold": 0.525, "active": False}

    updated = client.put(
        "/v1/streams/pump-1",
        json={
            "sample_period_s": 0.5,
            "has_reference": True,
            "detectors": {"point": {"threshold": 0.7}, "cusum": {"enabled": False}},
        },
    )
    assert updated.status_code == 200
    body = updated.json()
    assert body["sample_period_s"] == 0.5
    assert body["has_reference"] is True
    assert body["detectors"]["point"] == {"enabled": True, "threshold": 0.7, "policy": None}
    assert body["detectors"]["cusum"]["enabled"] is False
    assert body["created_at"] == created.json()["created_at"]
    assert body["updated_at"] > body["created_at"]

    assert client.get("/v1/streams/pump-1").json() == body


def test_multi_channel_stream_on_a_multi_channel_model(client: TestClient) -> None:
    response = client.put(
        "/v1/streams/mount-3", json={"model": "naive-2ch", "channels": ["value", "load"]}
    )
    assert response.status_code == 201
    assert response.json()["channels"] == ["value", "load"]
    # Without channel names a stream takes the model's own.
    defaulted = client.put("/v1/streams/mount-4", json={"model": "naive-2ch"})
    assert defaulted.json()["channels"] == ["value", "load"]
    renamed = client.put(
        "/v1/streams/mount-5", json={"model": "naive-2ch", "channels": ["x", "rpm"]}
    )
    assert renamed.json()["channels"] == ["x", "rpm"]


def test_list_and_delete(client: TestClient, database: Database) -> None:
    for stream_id in ("b", "a", "c"):
        assert client.put(f"/v1/streams/{stream_id}", json={}).status_code == 201
    with database.session() as session:
        make_alarm(session, "a", sample=5, closed_after=None)
    listing = client.get("/v1/streams").json()["items"]
    assert [item["id"] for item in listing] == ["a", "b", "c"]
    assert [len(item["open_alarms"]) for item in listing] == [1, 0, 0]
    assert listing[0]["open_alarms"][0]["detector"] == "point"

    deleted = client.delete("/v1/streams/a")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert client.get("/v1/streams/a").status_code == 404
    assert [item["id"] for item in client.get("/v1/streams").json()["items"]] == ["b", "c"]
    assert client.get("/v1/alarms").json()["items"] == []  # its alarms went with it
    assert client.delete("/v1/streams/a").status_code == 404


def test_the_list_pages_in_id_order(client: TestClient, database: Database) -> None:
    ids = [f"s{i:02d}" for i in range(7)]
    for stream_id in reversed(ids):
        assert client.put(f"/v1/streams/{stream_id}", json={}).status_code == 201
    with database.session() as session:
        make_alarm(session, "s05", sample=5, closed_after=None)
    seen: list[str] = []
    cursor = None
    for _ in range(4):
        params: dict[str, str | int] = {"limit": 3}
        if cursor is not None:
            params["cursor"] = cursor
        page = client.get("/v1/streams", params=params).json()
        seen += [item["id"] for item in page["items"]]
        for item in page["items"]:
            assert len(item["open_alarms"]) == (1 if item["id"] == "s05" else 0)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert client.get("/v1/streams").json()["next_cursor"] is None  # 100 by default
    for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "%%%"}):
        answer = client.get("/v1/streams", params=bad)
        assert answer.status_code == 422, bad
        assert answer.headers["content-type"] == "application/problem+json"


def test_model_channels_and_reference_are_fixed_once_readings_arrived(
    client: TestClient, database: Database
) -> None:
    assert client.put("/v1/streams/pump-1", json={}).status_code == 201
    readings = [{"t": T0.timestamp() + i / 10, "value": float(i)} for i in range(10)]
    posted = client.post("/v1/streams/pump-1/readings", json={"readings": readings})
    assert posted.status_code == 200

    changed = client.put("/v1/streams/pump-1", json={"has_reference": True})
    assert changed.status_code == 409
    assert changed.headers["content-type"] == PROBLEM
    assert "delete and re-create" in changed.json()["detail"]
    # Detector overrides may change at any time.
    tuned = client.put("/v1/streams/pump-1", json={"detectors": {"point": {"threshold": 1.0}}})
    assert tuned.status_code == 200
    assert tuned.json()["samples_seen"] == 10


def test_unknown_model_is_a_422_problem(client: TestClient) -> None:
    response = client.put("/v1/streams/pump-1", json={"model": "no-such-model"})
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["title"] == "Invalid data"
    assert "'no-such-model' is not loaded" in problem["detail"]
    assert "lstm-seed0" in problem["detail"]  # says what is loaded
    assert problem["instance"] == "/v1/streams/pump-1"
    # A model whose artifact failed to load is not loaded either.
    assert client.put("/v1/streams/pump-1", json={"model": "broken"}).status_code == 422
    assert client.get("/v1/streams/pump-1").status_code == 404


def test_channel_count_must_match_the_model(client: TestClient) -> None:
    response = client.put("/v1/streams/pump-1", json={"channels": ["value", "load"]})
    assert response.status_code == 422
    assert "takes 1 channel(s), the stream names 2" in response.json()["detail"]


def test_bad_stream_ids_are_422(client: TestClient) -> None:
    for bad in ("-starts-with-dash", "has space", "x" * 129, "semi;colon", "ünïcode"):
        response = client.put(f"/v1/streams/{bad}", json={})
        assert response.status_code == 422, bad
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["errors"][0]["field"] == "path.stream_id"
    assert client.put(f"/v1/streams/{'x' * 128}", json={}).status_code == 201
    assert client.put("/v1/streams/A.b_c-9", json={}).status_code == 201


def test_invalid_configurations_list_every_offending_field(client: TestClient) -> None:
    response = client.put(
        "/v1/streams/pump-1",
        json={
            "channels": ["value", "t"],
            "sample_period_s": -1,
            "has_reference": "perhaps",
            "detectors": {"psychic": {}},
            "colour": "red",
        },
    )
    assert response.status_code == 422
    problem = response.json()
    fields = {error["field"] for error in problem["errors"]}
    assert {
        "body.channels.1",
        "body.sample_period_s",
        "body.has_reference",
        "body.detectors.psychic.[key]",
        "body.colour",
    } <= fields, fields
    assert problem["type"].endswith("/validation-error")
    assert problem["status"] == 422
    assert "'t' is reserved" in problem["detail"]

    duplicated = client.put("/v1/streams/pump-1", json={"channels": ["value", "value"]})
    assert duplicated.status_code == 422
    assert "duplicate channel(s): value" in duplicated.json()["detail"]


def test_non_finite_numbers_are_refused(client: TestClient) -> None:
    for text in ('{"sample_period_s": NaN}', '{"sample_period_s": Infinity}'):
        response = client.put(
            "/v1/streams/pump-1", content=text, headers={"content-type": "application/json"}
        )
        assert 400 <= response.status_code < 500, text
        assert response.headers["content-type"] == PROBLEM
    threshold = client.put(
        "/v1/streams/pump-1",
        content='{"detectors": {"point": {"threshold": -Infinity}}}',
        headers={"content-type": "application/json"},
    )
    assert threshold.status_code == 422
    assert client.get("/v1/streams/pump-1").status_code == 404
