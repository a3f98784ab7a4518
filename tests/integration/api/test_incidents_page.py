"""The incidents page: open and recent incidents, newest first, filtered by stream and state,
each with its alarms, a link to its moment on the stream's chart, an acknowledgement form (a
name, and the API token once when the service requires one) and, for a stream that learned its
own model, the way to a new normal. Refusals are pages that say why."""

from __future__ import annotations

import html
import re
from datetime import timedelta

from app.monitoring.alarms import AlarmEvent
from app.registry import AUTO
from app.storage.db import Database
from app.storage.models import Stream
from app.storage.repositories import alarms as alarm_repo
from tests.integration.conftest import T0, AppFactory, make_stream

TOKEN = "s3cret-token-of-32-characters-ok"


def seeded(database: Database) -> None:
    """pump-1 (a learning stream): incident 1, a point alarm over 100..105, closed; incident
    2, a shift alarm from 250 joined by a point alarm at 252, open. pump-2: incident 3, closed."""
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
        learning = session.get(Stream, "pump-1")
        assert learning is not None
        learning.model_name = AUTO

        def apply(stream: str, opened: list[AlarmEvent], closed: list[AlarmEvent]) -> None:
            alarm_repo.apply(
                session,
                stream_id=stream,
                opened=opened,
                closed=closed,
                peaks={},
                time_of=lambda sample: T0 + timedelta(seconds=sample / 10),
                model_name="lstm-seed0",
                model_version="test",
            )

        spike = AlarmEvent("point", 100, 101, 9.0, 4.0, 105)
        apply("pump-1", [spike], [spike])
        apply("pump-1", [AlarmEvent("shift", 250, None, 3.0, 1.0)], [])
        apply("pump-1", [AlarmEvent("point", 252, None, 6.0, 4.0)], [])
        other = AlarmEvent("point", 150, 151, 5.0, 4.0, 155)
        apply("pump-2", [other], [other])


def rows(page: str) -> list[int]:
    return [int(found) for found in re.findall(r'<tr data-incident="(\d+)"', page)]


def test_the_incidents_page_lists_filters_and_links(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    seeded(database)
    page = client.get("/incidents")
    assert page.status_code == 200 and rows(page.text) == [2, 3, 1]
    assert 'aria-current="page">Incidents' in page.text
    assert rows(client.get("/incidents", params={"stream": "pump-2"}).text) == [3]
    assert rows(client.get("/incidents", params={"state": "open"}).text) == [2]
    assert "No incident matches these filters" in client.get("/incidents?stream=a%20b").text
    text = html.unescape(page.text)
    # The open one: its two alarms, the way to a new normal (pump-1 learns its model), and
    # its moment on the chart.
    row = text[text.index('<tr data-incident="2"') :]
    row = row[: row.index("</tr>")]
    assert ">shift</a>" in row and ">point</a>" in row and "open" in row
    assert "/streams/pump-1#new-normal" in row
    at = (T0 + timedelta(seconds=25)).timestamp()  # shift's first reading, 250
    assert f'/streams/pump-1?at={at:.3f}#chart"' in row, row
    closed = text[text.index('<tr data-incident="3"') :]
    assert "new-normal" not in closed[: closed.index("</tr>")]


def test_an_incident_is_acknowledged_from_the_page_with_the_token_once(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(api_token=TOKEN)
    seeded(database)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    without = client.post("/incidents/2/acknowledge", data={"by": "jane"})
    assert without.status_code == 401
    assert "Acknowledging needs this service's API token" in html.unescape(without.text)
    assert client.get("/v1/incidents/2", headers=headers).json()["acknowledged_by"] is None
    nameless = client.post("/incidents/2/acknowledge", data={"by": " ", "token": TOKEN})
    assert nameless.status_code == 422 and "Give a name" in html.unescape(nameless.text)
    absent = client.post("/incidents/99/acknowledge", data={"by": "jane", "token": TOKEN})
    assert absent.status_code == 404 and "There is no incident 99" in html.unescape(absent.text)
    done = client.post(
        "/incidents/2/acknowledge",
        data={"by": "jane", "token": TOKEN, "back": "/incidents?state=open"},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == (
        "/incidents?state=open&acknowledged=2"
    )
    page = html.unescape(client.get(done.headers["location"]).text)
    assert "Incident 2 on pump-1 is acknowledged by jane" in page
    assert 'name="token"' not in page  # asked once: the session keeps it
    incident = client.get("/v1/incidents/2", headers=headers).json()
    assert incident["acknowledged_by"] == "jane"
    alarms = client.get("/v1/alarms", params={"stream": "pump-1"}, headers=headers).json()
    assert {a["acknowledged_by"] for a in alarms["items"] if a["incident"] == 2} == {"jane"}
