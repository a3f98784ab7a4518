"""A stream that learns its own model has a lifecycle like a trained one: what it learned is
version 1 of `auto.<stream id>`, jobs make candidates beside it (recalibrated, or learned
afresh from a period), a candidate shadows, is promoted (the next alarms name it) and rolled
back; no other stream may run its versions.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import delete, update

from app.storage.db import Database
from app.storage.models import ModelEntry, Stream
from tests.integration.conftest import AppFactory
from tests.support.jobs import finished
from tests.support.models import epoch_times, lab_series

NORMAL = 7000  # the lab record's normal operation; its faults follow, up to 8000
LEARNING = 4000  # (its first revision, due at twice that, never comes within a test)


def readings(first: int, stop: int) -> dict[str, Any]:
    times = epoch_times(first, stop)
    values = lab_series().value[first:stop]
    return {
        "readings": [{"t": float(t), "value": float(v)} for t, v in zip(times, values, strict=True)]
    }


def post(client: TestClient, first: int, stop: int) -> list[dict[str, Any]]:
    answer = client.post("/v1/streams/pump-1/readings?results=false", json=readings(first, stop))
    assert answer.status_code == 200, answer.text
    return list(answer.json()["opened"])


def learned(client: TestClient) -> None:
    client.put("/v1/streams/pump-1", json={"learning": {"readings": LEARNING}})
    post(client, 0, NORMAL)
    deadline = time.monotonic() + 60
    while client.get("/v1/streams/pump-1").json()["phase"] != "monitoring":
        assert time.monotonic() < deadline, "the stream did not learn"
        time.sleep(0.05)


def statuses(client: TestClient) -> dict[int, str]:
    body = client.get("/v1/models/auto.pump-1").json()
    return {row["version"]: row["status"] for row in body["versions"]}


def job(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    queued = client.post("/v1/streams/pump-1/jobs", json=body)
    assert queued.status_code == 202, queued.text
    done = finished(client, queued.json()["id"])
    assert done["phase"] == "succeeded", done["error"]
    return done


def test_a_learned_stream_through_jobs_a_shadow_a_promotion_and_a_rollback(
    make_client: AppFactory,
) -> None:
    client = make_client(default_model="auto")
    learned(client)
    assert statuses(client) == {1: "active"}
    model = client.get("/v1/models/auto.pump-1").json()
    assert model["kind"] == "learned" and model["n_channels"] == 1

    since = float(epoch_times(4000, 4001)[0])
    recalibrated = job(client, {"kind": "recalibrate", "since": since, "false_alarms_per_day": 100})
    assert recalibrated["result"]["name"] == "auto.pump-1"
    assert recalibrated["result"]["version"] == 2
    relearned = job(client, {"kind": "retrain", "since": since})
    assert relearned["result"]["version"] == 3
    # Without a budget, a job keeps the one the stream runs with (1 a day, its default).
    relearned_budget = client.get("/v1/models/auto.pump-1/versions/3").json()["calibration"]
    assert relearned_budget["false_alarms_per_day"] == 1
    assert statuses(client) == {1: "active", 2: "candidate", 3: "candidate"}
    version = client.get("/v1/models/auto.pump-1/versions/2").json()
    assert version["kind"] == "learned"
    assert version["created_by"] == f"job {recalibrated['id']} (recalibrate)"
    assert version["source"]["from_version"] == 1 and version["source"]["readings"] == 3000
    assert version["calibration"]["false_alarms_per_day"] == 100
    assert client.get("/v1/models/auto.pump-1/versions/3").json()["source"]["readings"] == 3000

    # Version 3 shadows the lab's first faults; the stream (version 1) raises its own alarms.
    shadow = client.put("/v1/streams/pump-1/shadow", json={"name": "auto.pump-1", "version": 3})
    assert shadow.status_code == 200, shadow.text
    opened = post(client, NORMAL, NORMAL + 400)
    assert opened and {alarm["model"] for alarm in opened} == {"auto.pump-1"}
    assert {alarm["model_version"] for alarm in opened} == {"1"}
    compared = client.get("/v1/streams/pump-1/shadow").json()
    assert compared["readings"] == 400
    assert (compared["active"]["model"], compared["active"]["version"]) == ("auto.pump-1", "1")
    assert (compared["candidate"]["model"], compared["candidate"]["version"]) == (
        "auto.pump-1",
        "3",
    )
    assert compared["candidate"]["alarms"] >= 1  # it sees the spike too

    # Promote version 2: the next alarms name it.
    promoted = client.post("/v1/streams/pump-1/model", json={"name": "auto.pump-1", "version": 2})
    assert promoted.status_code == 200, promoted.text
    body = promoted.json()
    assert body["model"] == "auto" and body["model_version"] == 2
    assert body["previous_model"] == {"name": "auto.pump-1", "version": 1}
    assert body["phase"] == "monitoring"
    assert statuses(client) == {1: "retired", 2: "active", 3: "candidate"}
    opened = post(client, NORMAL + 400, NORMAL + 800)
    assert opened and {alarm["model_version"] for alarm in opened} == {"2"}

    # Roll back to 1: the readings go on under it, none lost.
    rolled = client.post("/v1/streams/pump-1/model", json={"name": "auto.pump-1", "version": 1})
    assert rolled.status_code == 200 and rolled.json()["model_version"] == 1
    assert statuses(client) == {1: "active", 2: "retired", 3: "candidate"}
    opened = post(client, NORMAL + 800, NORMAL + 1000)
    assert {alarm["model_version"] for alarm in opened} <= {"1"}
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["samples_seen"] == NORMAL + 1000
    assert stream["learned_model"]["thresholds_from"] == NORMAL + 800  # revised from there on

    # A restart runs what the stream ran last.
    client.__exit__(None, None, None)
    again = make_client(default_model="auto")
    stream = again.get("/v1/streams/pump-1").json()
    assert stream["model_version"] == 1 and stream["samples_seen"] == NORMAL + 1000


def test_a_learned_model_runs_on_its_own_stream_only(make_client: AppFactory) -> None:
    client = make_client(default_model="auto")
    learned(client)
    client.put("/v1/streams/other", json={"learning": {"readings": LEARNING}})
    client.put("/v1/streams/trained", json={"model": "lstm-seed0"})

    def switch(stream: str, body: object) -> tuple[int, str]:
        answer = client.post(f"/v1/streams/{stream}/model", json=body)
        return answer.status_code, answer.json().get("detail", "")

    mine = {"name": "auto.pump-1", "version": 1}
    assert switch("other", mine) == (
        409,
        "model 'auto.pump-1' is what another stream learned: only that stream runs it",
    )
    assert switch("trained", mine)[0] == 409
    assert client.put("/v1/streams/trained/shadow", json=mine).status_code == 409
    assert switch("pump-1", mine) == (409, "stream 'pump-1' runs auto.pump-1 version 1 already")
    assert switch("pump-1", {"name": "auto.pump-1", "version": 2}) == (
        404,
        "model 'auto.pump-1' has no version 2",
    )
    still = client.post("/v1/streams/other/jobs", json={"kind": "recalibrate"})
    assert still.status_code == 409
    assert still.json()["detail"] == (
        "stream 'other' is still learning: a job works on the model it learns"
    )
    epochs = client.post("/v1/streams/pump-1/jobs", json={"kind": "retrain", "epochs": 3})
    assert epochs.status_code == 422
    assert epochs.json()["detail"] == (
        "stream 'pump-1' learns its own model, which has no epochs: leave them out"
    )
    assert client.get("/v1/models/auto.other").status_code == 404
    assert client.get("/v1/models/auto.pump-1").status_code == 200


def test_a_deleted_stream_takes_its_learned_models_with_it(make_client: AppFactory) -> None:
    client = make_client(default_model="auto")
    learned(client)
    assert client.get("/v1/models/auto.pump-1/versions/1").status_code == 200
    assert client.delete("/v1/streams/pump-1").status_code == 204
    assert client.get("/v1/models/auto.pump-1/versions/1").status_code == 404
    # Made again under the same id, it learns afresh: version 1 again, of the new readings.
    learned(client)
    assert statuses(client) == {1: "active"}


def test_a_stream_that_learned_before_learned_versions_runs_version_1(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(default_model="auto")
    learned(client)
    client.__exit__(None, None, None)
    with database.session() as session:  # as a stream learned before versions were kept
        session.execute(update(Stream).values(model_version=None))
        session.execute(delete(ModelEntry).where(ModelEntry.name == "auto.pump-1"))
    again = make_client(default_model="auto")
    assert again.get("/v1/streams/pump-1").json()["model_version"] == 1
    assert statuses(again) == {1: "active"}
    opened = again.post("/v1/streams/pump-1/readings", json=readings(NORMAL, NORMAL + 200))
    assert {alarm["model_version"] for alarm in opened.json()["opened"]} == {"1"}
