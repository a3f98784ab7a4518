"""A process that settles at a new operating point: a learned stream keeps it one open incident
for as long as it lasts, and never gets used to it by itself; an operator who confirms it as
the new normal (the stream page's button, or a retrain job from the moment it began and a switch
to the version it makes) has the stream learn afresh from the readings since, after which the
new level raises nothing."""

from __future__ import annotations

import html
import re
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from app.learning.learn import LearnedModel
from app.storage.repositories import learned as learned_repo
from app.streams import handover
from tests.integration.conftest import AppFactory
from tests.support.jobs import finished

START = 1_700_000_000.0
LEARNING = 1000
SHIFT = 2000  # the process moves to its new operating point here, and stays


def levels(count: int) -> np.ndarray:
    """An autoregression (0.6) about 50, 5 of its spreads higher from `SHIFT` on."""
    rng = np.random.default_rng(8)
    values = np.empty(count)
    values[0] = 0.0
    noise = rng.normal(0, 1, count)
    for t in range(1, count):
        values[t] = 0.6 * values[t - 1] + noise[t]
    values += 50
    values[SHIFT:] += 5 * 1.25
    return values


VALUES = levels(5000)


def post(client: TestClient, first: int, stop: int) -> list[dict[str, Any]]:
    body = {"readings": [{"t": START + i, "value": float(VALUES[i])} for i in range(first, stop)]}
    answer = client.post("/v1/streams/m/readings?results=false", json=body)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["opened"])


def open_alarms(client: TestClient) -> list[dict[str, Any]]:
    return list(client.get("/v1/streams/m").json()["open_alarms"])


def learned_stream(client: TestClient) -> None:
    client.put("/v1/streams/m", json={"learning": {"readings": LEARNING}})
    post(client, 0, LEARNING)
    deadline = time.monotonic() + 60
    while not client.get("/v1/streams/m").json().get("learned_model"):
        assert time.monotonic() < deadline, "the stream did not learn"
        time.sleep(0.05)


def test_a_new_operating_point_stays_a_fault_until_an_operator_confirms_it_on_the_page(
    make_client: AppFactory,
) -> None:
    client = make_client(default_model="auto")
    learned_stream(client)
    assert post(client, LEARNING, SHIFT) == []  # normal
    opened = post(client, SHIFT, 3500)
    assert opened and min(alarm["opened_sample"] for alarm in opened) < SHIFT + 10
    # 1,500 readings on, the new level is still a fault: one incident, open.
    assert open_alarms(client)
    incidents = client.get("/v1/incidents", params={"stream": "m"}).json()["items"]
    assert [incident["state"] for incident in incidents] == ["open"]

    page = client.get("/streams/m")
    assert page.status_code == 200 and 'id="new-normal"' in page.text
    (since,) = re.findall(
        r'name="since" type="datetime-local" step="1" required value="([^"]*)"', page.text
    )
    began = datetime.fromisoformat(since).replace(tzinfo=UTC).timestamp()
    assert START + SHIFT <= began < START + SHIFT + 10  # the open alarms began then

    confirmed = client.post("/streams/m/new-normal", data={"since": since}, follow_redirects=False)
    assert confirmed.status_code == 303, confirmed.text
    (job,) = client.get("/v1/jobs", params={"stream": "m"}).json()["items"][:1]
    assert job["kind"] == "retrain" and job["params"]["since"] == began
    done = finished(client, job["id"])
    assert done["phase"] == "succeeded", done["error"]

    page = html.unescape(client.get("/streams/m").text)
    version = done["result"]["version"]
    assert f"job {job['id']} succeeded" in page and f"Run version {version}, the new" in page
    ran = client.post(
        "/streams/m/run", data={"name": "auto.m", "version": str(version)}, follow_redirects=False
    )
    assert ran.status_code == 303, ran.text
    stream = client.get("/v1/streams/m").json()
    assert (stream["model_version"], stream["open_alarms"]) == (version, [])
    assert (
        client.get("/v1/incidents", params={"stream": "m", "state": "open"}).json()["items"] == []
    )
    # The new level is normal now, and the page no longer offers what runs.
    assert post(client, 3500, 5000) == []
    assert "Run version" not in client.get("/streams/m").text


def test_a_new_normal_needs_a_moment_and_the_token(make_client: AppFactory) -> None:
    token = "s3cret-token-of-32-characters-ok"
    client = make_client(default_model="auto", api_token=token)
    headers = {"Authorization": f"Bearer {token}"}
    client.headers.update(headers)
    learned_stream(client)
    client.headers.pop("Authorization")
    refused = client.post("/streams/m/new-normal", data={"since": "2023-11-14T22:13:20"})
    assert refused.status_code == 401
    assert "Learning a new normal needs this service's API token" in html.unescape(refused.text)
    nonsense = client.post("/streams/m/new-normal", data={"since": "soon", "token": token})
    assert nonsense.status_code == 422 and "as a date and time" in html.unescape(nonsense.text)
    wrong = client.post("/streams/m/run", data={"name": "auto.m", "version": "9", "token": token})
    assert wrong.status_code == 404
    jobs = client.get("/v1/jobs", params={"stream": "m"}, headers=headers).json()["items"]
    assert [job["kind"] for job in jobs] == ["learn"]  # no retrain was queued
    assert client.post("/streams/nothing/new-normal", data={"since": "x"}).status_code == 404


def test_thresholds_revised_while_an_alarm_opened_are_not_adopted(
    make_client: AppFactory,
) -> None:
    """A revision fitted before an alarm opened arrives while it is open: refused (it is fitted
    again once the alarm has closed), so a fault's alarm is never closed by raised thresholds."""
    client = make_client(default_model="auto")
    learned_stream(client)
    post(client, LEARNING, SHIFT + 50)  # the shift: its alarm open
    assert open_alarms(client)
    state = client.app_state["twinwatch"]
    streams = state.streams
    with state.database.session() as session:
        row = learned_repo.get(session, "m")
        assert row is not None
        fitted_at, revisions = row.fitted_at, len(row.revisions)
        monitor = LearnedModel.from_json(row.model).monitor
    assert not handover.adopt_revision(
        streams, "m", monitor, fitted_at=fitted_at, revisions=revisions
    )
    with state.database.session() as session:
        after = learned_repo.get(session, "m")
        assert after is not None and len(after.revisions) == revisions
