"""A model's life on a real `twinwatch serve`: jobs make candidates from the stored readings,
a candidate shadows the stream, is promoted (the next alarms name it) and rolled back; the
server is killed while a job trains and while a promotion runs, and after each restart no
reading is lost or doubled, the job is failed (never half-written) and the stream runs one
version or the other, whole."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import (
    E2E_BACKENDS,
    ServerFactory,
    new_database,
    restarted,
    try_switch,
)
from tests.support.jobs import finished
from tests.support.models import epoch_times, lab_series

NORMAL = 7000  # the lab record's normal operation; its faults follow, up to 8000
BATCH = 500


def readings(first: int, stop: int) -> dict[str, Any]:
    series = lab_series()
    times = epoch_times(first, stop)
    return {
        "readings": [
            {"t": float(t), "value": float(v)}
            for t, v in zip(times, series.value[first:stop], strict=True)
        ]
    }


def post(client: httpx.Client, first: int, stop: int) -> list[dict[str, Any]]:
    """Readings [first, stop) in batches; the alarms they opened."""
    opened: list[dict[str, Any]] = []
    for start in range(first, stop, BATCH):
        answer = client.post(
            "/v1/streams/pump-1/readings?results=false",
            json=readings(start, min(stop, start + BATCH)),
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["accepted"] == min(stop, start + BATCH) - start
        opened += answer.json()["opened"]
    return opened


def versions(client: httpx.Client) -> dict[int, str]:
    body = client.get("/v1/models/lstm-seed0").json()
    return {row["version"]: row["status"] for row in body["versions"]}


@pytest.mark.parametrize("backend", E2E_BACKENDS)
def test_a_model_through_jobs_a_shadow_a_promotion_a_rollback_and_two_kills(
    backend: str, make_server: ServerFactory, databases: Any, tmp_path: Path
) -> None:
    server = make_server("lifecycle", new_database(databases, backend, tmp_path))
    server.start()
    client = httpx.Client(base_url=server.base_url, timeout=120)
    assert client.put("/v1/streams/pump-1", json={"model": "lstm-seed0"}).status_code == 201
    post(client, 0, NORMAL - 1000)

    # Killed while a retrain trains: the job fails, no version is half-made.
    job = client.post("/v1/streams/pump-1/jobs", json={"kind": "retrain", "epochs": 500}).json()
    deadline = time.monotonic() + 120
    while client.get(f"/v1/jobs/{job['id']}").json()["progress"].get("step") != "training":
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.2)
    client = restarted(server)
    killed = client.get(f"/v1/jobs/{job['id']}").json()
    assert killed["phase"] == "failed"
    assert killed["error"] == "the service stopped while the job ran"
    assert versions(client) == {1: "active"}
    post(client, NORMAL - 1000, NORMAL)

    # A recalibration and a retrain make candidates 2 and 3.
    budget = {"false_alarms_per_day": 2000}
    since = float(epoch_times(5000, 5001)[0])
    recalibrate = client.post(
        "/v1/streams/pump-1/jobs", json={"kind": "recalibrate", "since": since, **budget}
    ).json()
    retrain = client.post(
        "/v1/streams/pump-1/jobs", json={"kind": "retrain", "epochs": 2, **budget}
    ).json()
    assert finished(client, recalibrate["id"])["result"]["version"] == 2
    assert finished(client, retrain["id"])["result"]["version"] == 3
    assert versions(client) == {1: "active", 2: "candidate", 3: "candidate"}

    # Version 2 shadows the faults; the stream (version 1) raises its own alarms.
    client.put("/v1/streams/pump-1/shadow", json={"name": "lstm-seed0", "version": 2})
    opened = post(client, NORMAL, NORMAL + 400)
    compared = client.get("/v1/streams/pump-1/shadow").json()
    assert compared["readings"] == 400
    assert compared["candidate"]["alarms"] >= 1
    assert {alarm["model_version"] for alarm in opened} <= {"1"}

    # Promote 2: the next alarms name it; the shadow ends.
    promoted = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 2})
    assert promoted.status_code == 200 and promoted.json()["model_version"] == 2
    assert client.get("/v1/streams/pump-1/shadow").status_code == 404
    opened = post(client, NORMAL + 400, NORMAL + 700)
    assert opened and {alarm["model_version"] for alarm in opened} == {"2"}

    # Killed during a promotion to 3: after the restart the stream runs 2 or 3, whole, and
    # every acknowledged reading is there once.
    switching = threading.Thread(
        target=lambda: try_switch(server, "pump-1", {"name": "lstm-seed0", "version": 3})
    )
    switching.start()
    time.sleep(0.05)
    client = restarted(server)
    switching.join()
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["samples_seen"] == NORMAL + 700
    assert stream["model_version"] in (2, 3)
    if stream["model_version"] == 3:
        assert stream["previous_model"] == {"name": "lstm-seed0", "version": 2}
    resent = client.post("/v1/streams/pump-1/readings", json=readings(NORMAL + 600, NORMAL + 700))
    assert resent.json()["duplicates"] == 100 and resent.json()["accepted"] == 0

    # Roll back to 1; the readings go on under it.
    rolled = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 1})
    assert rolled.status_code == 200 and rolled.json()["model_version"] == 1
    opened = post(client, NORMAL + 700, NORMAL + 1000)
    assert {alarm["model_version"] for alarm in opened} <= {"1"}
    assert client.get("/v1/streams/pump-1").json()["samples_seen"] == NORMAL + 1000
    server.stop()
