"""A learned stream's life on a real `twinwatch serve`, on the twin: the stream learns its model
from its first readings; the sensor's gain changes and stays changed for hours (the twin's `gain`
fault held); a recalibration and a retrain of the changed period make candidates; the retrained
one shadows, is promoted (the next alarms name it) and rolled back. The server is killed while
a job runs and while a promotion runs: after each restart no reading is lost or doubled, the job
is reported failed or finished (never half-made) and the stream runs one version or the other.
"""

from __future__ import annotations

import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.simulation.faults import Fault, FaultType, inject_faults
from tests.e2e.conftest import (
    E2E_BACKENDS,
    ServerFactory,
    new_database,
    restarted,
    try_switch,
)
from tests.support.jobs import FINISHED, finished
from tests.support.models import epoch_times

STREAM = "pump-1"
NAME = f"auto.{STREAM}"
HOUR = 36_000  # readings at 10 Hz
LEARNING = 3_000  # its first five minutes
CHANGE = 18_000  # the gain changes after half an hour of normal operation
SHADOWED = CHANGE + 3 * HOUR  # held three hours, then a candidate shadows the stream
PROMOTED = SHADOWED + HOUR // 2
SPIKE = PROMOTED + 600  # a spike after the promotion: an alarm the new version raises
TOTAL = PROMOTED + HOUR // 2
BATCH = 3_000


@cache
def twin() -> np.ndarray:
    faults = [
        Fault(type=FaultType.GAIN, start=CHANGE, end=TOTAL, factor=1.5),
        Fault(type=FaultType.SPIKE, start=SPIKE, end=SPIKE + 1, magnitude=40.0),
    ]
    return inject_faults(7, TOTAL, faults).value


def post(client: httpx.Client, first: int, stop: int) -> list[dict[str, Any]]:
    """Readings [first, stop) in batches, each acknowledged whole; the alarms they opened."""
    opened: list[dict[str, Any]] = []
    for start in range(first, stop, BATCH):
        end = min(stop, start + BATCH)
        answer = client.post(f"/v1/streams/{STREAM}/readings?results=false", json=body(start, end))
        assert answer.status_code == 200, answer.text
        assert answer.json()["accepted"] == end - start
        opened += answer.json()["opened"]
    return opened


def body(first: int, stop: int) -> dict[str, Any]:
    times = epoch_times(first, stop)
    return {
        "readings": [
            {"t": float(t), "value": float(v)}
            for t, v in zip(times, twin()[first:stop], strict=True)
        ]
    }


def at(sample: int) -> float:
    return float(epoch_times(sample, sample + 1)[0])


def versions(client: httpx.Client) -> dict[int, dict[str, Any]]:
    return {row["version"]: row for row in client.get(f"/v1/models/{NAME}").json()["versions"]}


def stream(client: httpx.Client) -> dict[str, Any]:
    answer = client.get(f"/v1/streams/{STREAM}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def wait(condition: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("backend", E2E_BACKENDS)
def test_a_learned_stream_through_a_held_change_jobs_a_promotion_a_rollback_and_two_kills(
    backend: str, make_server: ServerFactory, databases: Any, tmp_path: Path
) -> None:
    server = make_server("learned", new_database(databases, backend, tmp_path))
    server.start()
    client = httpx.Client(base_url=server.base_url, timeout=300)
    created = client.put(
        f"/v1/streams/{STREAM}", json={"model": "auto", "learning": {"readings": LEARNING}}
    )
    assert created.status_code == 201, created.text

    # It learns from its first five minutes and watches the rest of the half hour quietly.
    assert post(client, 0, CHANGE) == []
    wait(lambda: stream(client)["phase"] == "monitoring", "the stream did not learn")
    # Version 1 is what it learned; its thresholds are revised as its readings double (at
    # 6,000 and 12,000 readings: versions 2 and 3, once the learner's jobs have run).
    made = versions(client)
    assert made[1]["created_by"] == "learning"
    assert stream(client)["model_version"] in made
    assert all(made[v]["created_by"] == "revision" for v in made if v > 1)

    # The gain changes and stays: the stream alarms within minutes.
    opened = post(client, CHANGE, SHADOWED)
    assert opened, "the held gain change raised no alarm"
    first = min(alarm["opened_sample"] for alarm in opened)
    assert CHANGE <= first < CHANGE + 3_000, f"the first alarm came at sample {first}"
    assert {alarm["model"] for alarm in opened} == {NAME}
    running = stream(client)["model_version"]  # 1, or a revision of its thresholds since

    # Killed while a job runs: it is reported failed or finished, and made a version only if
    # it finished.
    since = {"since": at(CHANGE + HOUR)}  # the changed gain is the normal now
    killed = client.post(f"/v1/streams/{STREAM}/jobs", json={"kind": "retrain", **since}).json()
    wait(
        lambda: client.get(f"/v1/jobs/{killed['id']}").json()["phase"] != "queued",
        "the job did not start",
    )
    client = restarted(server, timeout_s=300)
    after = client.get(f"/v1/jobs/{killed['id']}").json()
    assert after["phase"] in ("failed", "succeeded")
    made = [v for v in versions(client).values() if f"job {killed['id']} " in v["created_by"]]
    if after["phase"] == "failed":
        assert after["error"] == "the service stopped while the job ran" and made == []
    else:
        assert [v["version"] for v in made] == [after["result"]["version"]]
    assert stream(client)["samples_seen"] == SHADOWED

    # A recalibration and a retrain of the changed period make candidates.
    recalibrate = client.post(
        f"/v1/streams/{STREAM}/jobs", json={"kind": "recalibrate", **since}
    ).json()
    retrain = client.post(f"/v1/streams/{STREAM}/jobs", json={"kind": "retrain", **since}).json()
    recalibrated = finished(client, recalibrate["id"])
    retrained = finished(client, retrain["id"])
    assert recalibrated["phase"] == retrained["phase"] == "succeeded", (recalibrated, retrained)
    candidate = retrained["result"]["version"]
    recalibrated_version = recalibrated["result"]["version"]
    table = versions(client)
    assert table[candidate]["status"] == table[recalibrated_version]["status"] == "candidate"
    assert table[candidate]["source"]["readings"] == 2 * HOUR

    # The retrained candidate shadows the next half hour of the changed gain: it forecasts it
    # at least as well as the running version and would alarm no more often.
    shadow = client.put(f"/v1/streams/{STREAM}/shadow", json={"name": NAME, "version": candidate})
    assert shadow.status_code == 200, shadow.text
    opened = post(client, SHADOWED, PROMOTED)
    compared = client.get(f"/v1/streams/{STREAM}/shadow").json()
    assert compared["readings"] == PROMOTED - SHADOWED
    assert compared["candidate"]["residual_rmse"] <= compared["active"]["residual_rmse"] * 1.05
    assert compared["candidate"]["alarms"] <= compared["active"]["alarms"]
    assert all(alarm["model_version"] != str(candidate) for alarm in opened)

    # Promote it: the spike that follows raises an alarm naming it.
    before = stream(client)["model_version"]
    promoted = client.post(f"/v1/streams/{STREAM}/model", json={"name": NAME, "version": candidate})
    assert promoted.status_code == 200, promoted.text
    previous = promoted.json()["previous_model"]
    assert previous["name"] == NAME
    if previous["version"] != before:  # a revision of its thresholds landed in between
        assert previous["version"] > before
        assert versions(client)[previous["version"]]["created_by"] == "revision"
        before = previous["version"]
    assert versions(client)[candidate]["status"] == "active"
    opened = post(client, PROMOTED, SPIKE + 300)
    assert opened and {alarm["model_version"] for alarm in opened} == {str(candidate)}
    assert any(alarm["opened_sample"] == SPIKE for alarm in opened)

    # Killed during a promotion to the recalibrated version: after the restart the stream runs
    # one or the other, whole, and every acknowledged reading is there once.
    switching = threading.Thread(
        target=lambda: try_switch(server, STREAM, {"name": NAME, "version": recalibrated_version})
    )
    switching.start()
    time.sleep(0.05)
    client = restarted(server, timeout_s=300)
    switching.join()
    now = stream(client)
    assert now["samples_seen"] == SPIKE + 300
    assert now["model_version"] in (candidate, recalibrated_version)
    resent = client.post(f"/v1/streams/{STREAM}/readings", json=body(SPIKE + 200, SPIKE + 300))
    assert resent.json()["duplicates"] == 100 and resent.json()["accepted"] == 0

    # Roll back to what ran before the promotion; the readings go on under it.
    rolled = client.post(f"/v1/streams/{STREAM}/model", json={"name": NAME, "version": before})
    assert rolled.status_code == 200, rolled.text
    opened = post(client, SPIKE + 300, TOTAL)
    assert {alarm["model_version"] for alarm in opened} <= {str(before)}
    assert stream(client)["samples_seen"] == TOTAL
    assert running <= before
    jobs = client.get("/v1/jobs", params={"stream": STREAM, "limit": 500}).json()["items"]
    assert all(job["phase"] in FINISHED for job in jobs)
    learned = [job for job in jobs if job["kind"] == "learn"]
    assert [job["result"] for job in learned] == [{"name": NAME, "version": 1}]
    # (A revision a kill or a switch overtook made no version, and says so.)
    revised = [job for job in jobs if job["kind"] == "revise" and job["phase"] == "succeeded"]
    revisions = {job["result"]["version"] for job in revised}
    assert revisions == {
        v for v, row in versions(client).items() if row["created_by"] == "revision"
    }
    server.stop()
