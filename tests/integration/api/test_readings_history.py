"""Reading back a stream's stored readings with their forecasts, residuals and statistics:
what the stream gave live, recomputed; or per time bucket."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api import readings as readings_api
from tests.integration.conftest import T0, AppFactory

COUNT = 3000


def signal() -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.sin(np.arange(COUNT) / 15) + rng.normal(0, 0.05, COUNT)


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    return make_client()


def post(client: TestClient, values: np.ndarray, first: int = 0) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for start in range(0, len(values), 500):
        body = {
            "readings": [
                {"t": T0.timestamp() + (first + i) / 10, "value": float(values[i])}
                for i in range(start, min(start + 500, len(values)))
            ]
        }
        answer = client.post("/v1/streams/pump-1/readings", json=body)
        assert answer.status_code == 200, answer.text
        results += answer.json()["results"]
    return results


def test_a_range_gives_what_the_stream_gave_live(client: TestClient) -> None:
    client.put("/v1/streams/pump-1", json={})
    live = post(client, signal())
    since, until = T0.timestamp() + 250.0, T0.timestamp() + 280.0  # readings 2500..2799
    answer = client.get(
        "/v1/streams/pump-1/readings", params={"since": since, "until": until}
    ).json()
    assert answer["model"] == "lstm-seed0" and answer["model_version"] == "1"
    assert answer["t"] == pytest.approx([T0.timestamp() + i / 10 for i in range(2500, 2800)])
    assert answer["value"] == pytest.approx(signal()[2500:2800].tolist())
    assert answer["forecast"] == [r["forecast"] for r in live[2500:2800]]
    assert answer["residual"] == [r["residual"] for r in live[2500:2800]]
    for kind in ("point", "rolling_rms"):
        assert answer["statistics"][kind] == [r["statistics"][kind] for r in live[2500:2800]]
    assert answer["thresholds"]["point"] == 0.525
    whole = client.get("/v1/streams/pump-1/readings").json()
    assert len(whole["t"]) == COUNT and whole["forecast"][:8] == [None] * 8  # warming up


def test_buckets_summarise_a_range(client: TestClient) -> None:
    client.put("/v1/streams/pump-1", json={})
    post(client, signal())
    answer = client.get("/v1/streams/pump-1/readings", params={"step_s": 60}).json()
    assert answer["step_s"] == 60 and answer["value"] is None
    assert sum(answer["count"]) == COUNT
    first = answer["count"][0]
    values = signal()[:first]
    assert answer["buckets"]["value"]["mean"][0] == pytest.approx(float(values.mean()))
    assert answer["buckets"]["value"]["max"][0] == pytest.approx(float(values.max()))
    assert set(answer["buckets"]) == {
        "value",
        "forecast",
        "residual",
        "point",
        "rolling_rms",
        "missing",
    }


def test_a_learning_stream_has_readings_but_no_forecasts(client: TestClient) -> None:
    client.put("/v1/streams/pump-1", json={"model": "auto", "learning": {"readings": 5000}})
    post(client, signal()[:100])
    answer = client.get("/v1/streams/pump-1/readings").json()
    assert len(answer["value"]) == 100 and answer["forecast"] == [None] * 100


def test_bad_ranges_are_refused(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    client.put("/v1/streams/pump-1", json={})
    post(client, signal()[:200])
    refused = client.get("/v1/streams/pump-1/readings", params={"since": 2e9, "until": 1e9})
    assert refused.status_code == 422 and refused.json()["detail"] == "until must be after since"
    assert client.get("/v1/streams/pump-1/readings", params={"step_s": 0}).status_code == 422
    assert client.get("/v1/streams/ghost/readings").status_code == 404
    monkeypatch.setattr(readings_api, "MOST_RECOMPUTED", 100)
    too_many = client.get("/v1/streams/pump-1/readings")
    assert too_many.status_code == 422
    assert "the range holds 200 readings; at most 100" in too_many.json()["detail"]
    after = client.get("/v1/streams/pump-1/readings", params={"since": 2e9}).json()
    assert after["t"] == [] and after["value"] == []
