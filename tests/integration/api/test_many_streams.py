"""`PUT /v1/streams`: a fleet onboarded in one request, all or nothing, each stream checked by
the rules of its own PUT."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.integration.conftest import AppFactory


def test_a_fleet_is_created_and_updated_in_one_request(client: TestClient) -> None:
    fleet = [{"id": f"pump-{i}", "model": "auto"} for i in range(50)]
    fleet.append({"id": "twin", "model": "lstm-seed0", "has_reference": True})
    answer = client.put("/v1/streams", json={"streams": fleet})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"created": [s["id"] for s in fleet], "updated": []}
    assert client.get("/v1/streams/pump-7").json()["phase"] == "learning"
    twin = client.get("/v1/streams/twin").json()
    assert twin["has_reference"] and "missing" in twin["live"]["detectors"]

    again = [
        {"id": "pump-7", "model": "auto", "false_alarms_per_day": 3},
        {"id": "pump-new", "model": "auto"},
    ]
    answer = client.put("/v1/streams", json={"streams": again})
    assert answer.json() == {"created": ["pump-new"], "updated": ["pump-7"]}
    assert client.get("/v1/streams/pump-7").json()["false_alarms_per_day"] == 3
    listed = client.get("/v1/streams", params={"limit": 500}).json()["items"]
    assert len(listed) == 52


def test_one_bad_stream_refuses_them_all_and_is_named(make_client: AppFactory) -> None:
    client = make_client(metrics_per_stream="all")
    fleet = [
        {"id": "ok-1", "model": "auto"},
        {"id": "bad", "model": "lstm-seed0", "detectors": {"cusum": {"threshold": 2.0}}},
        {"id": "ok-2", "model": "auto"},
    ]
    answer = client.put("/v1/streams", json={"streams": fleet})
    assert answer.status_code == 422
    problem = answer.json()
    assert problem["stream"] == "bad" and "stream 'bad'" in problem["detail"]
    assert client.get("/v1/streams").json()["items"] == []
    assert "ok-1" not in client.get("/metrics").text

    unknown = [{"id": "x", "model": "never-trained"}]
    assert client.put("/v1/streams", json={"streams": unknown}).status_code == 422
    twice = [{"id": "x", "model": "auto"}, {"id": "x", "model": "auto"}]
    answer = client.put("/v1/streams", json={"streams": twice})
    assert answer.status_code == 422 and "more than once" in answer.json()["detail"]
    strings = [{"id": "x", "model": "auto", "sample_period_s": "1"}]
    answer = client.put("/v1/streams", json={"streams": strings})
    assert answer.status_code == 422 and "streams.0.sample_period_s" in answer.text
    assert client.put("/v1/streams", json={"streams": []}).status_code == 422


def test_a_stream_with_readings_keeps_its_model_in_a_fleet_update(client: TestClient) -> None:
    client.put("/v1/streams", json={"streams": [{"id": "a", "model": "auto"}]})
    reading = {"readings": [{"t": 1_767_225_600.0, "value": 1.0}]}
    assert client.post("/v1/streams/a/readings", json=reading).status_code == 200
    fleet = [{"id": "a", "model": "lstm-seed0"}, {"id": "b", "model": "auto"}]
    answer = client.put("/v1/streams", json={"streams": fleet})
    assert answer.status_code == 409 and answer.json()["stream"] == "a"
    assert client.get("/v1/streams/b").status_code == 404
