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


def seeded(database: Database) -> dict[str, int]:
    """pump-1 (a learning stream): a point alarm over 100..105, closed (incident "spike"); a
    shift alarm from 250 joined by a point alarm at 252, open ("open"). pump-2: a closed one
    ("other"). Returns the incidents' ids."""
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
        learning = session.get(Stream, "pump-1")
        assert learning is not None
        learning.model_name = AUTO

        def apply(stream: str, opened: list[AlarmEvent], closed: list[AlarmEvent]) -> int:
            done = alarm_repo.apply(
                session,
                stream_id=stream,
                opened=opened,
                closed=closed,
                peaks={},
                time_of=lambda sample: T0 + timedelta(seconds=sample / 10),
                model_name="lstm-seed0",
                model_version="test",
            )
            incident = done.opened[0].incident_id
            assert incident is not None
            return incident

        spike = AlarmEvent("point", 100, 101, 9.0, 4.0, 105)
        ids = {"spike": apply("pump-1", [spike], [spike])}
        ids["open"] = apply("pump-1", [AlarmEvent("shift", 250, None, 3.0, 1.0)], [])
        assert apply("pump-1", [AlarmEvent("point", 252, None, 6.0, 4.0)], []) == ids["open"]
        other = AlarmEvent("point", 150, 151, 5.0, 4.0, 155)
        ids["other"] = apply("pump-2", [other], [other])
        return ids


def rows(page: str) -> list[int]:
    return [int(found) for found in re.findall(r'<tr data-incident="(\d+)"', page)]


def test_the_incidents_page_lists_filters_and_links(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    ids = seeded(database)
    page = client.get("/incidents")
    assert page.status_code == 200
    assert rows(page.text) == [ids["open"], ids["other"], ids["spike"]]
    assert 'aria-current="page">Incidents' in page.text
    assert rows(client.get("/incidents", params={"stream": "pump-2"}).text) == [ids["other"]]
    assert rows(client.get("/incidents", params={"state": "open"}).text) == [ids["open"]]
    assert "No incident matches these filters" in client.get("/incidents?stream=a%20b").text
    text = html.unescape(page.text)
    # The open one: its two alarms, the way to a new normal (pump-1 learns its model), and
    # its moment on the chart.
    row = text[text.index(f'<tr data-incident="{ids["open"]}"') :]
    row = row[: row.index("</tr>")]
    assert ">shift</a>" in row and ">point</a>" in row and "open" in row
    assert "/streams/pump-1#new-normal" in row
    at = (T0 + timedelta(seconds=25)).timestamp()  # shift's first reading, 250
    assert f'/streams/pump-1?at={at:.3f}#chart"' in row, row
    closed = text[text.index(f'<tr data-incident="{ids["other"]}"') :]
    assert "new-normal" not in closed[: closed.index("</tr>")]


def test_an_incident_is_acknowledged_from_the_page_with_the_token_once(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(api_token=TOKEN)
    number = seeded(database)["open"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    without = client.post(f"/incidents/{number}/acknowledge", data={"by": "jane"})
    assert without.status_code == 401
    assert "Acknowledging needs this service's API token" in html.unescape(without.text)
    assert client.get(f"/v1/incidents/{number}", headers=headers).json()["acknowledged_by"] is None
    nameless = client.post(f"/incidents/{number}/acknowledge", data={"by": " ", "token": TOKEN})
    assert nameless.status_code == 422 and "Give a name" in html.unescape(nameless.text)
    nowhere = number + 1000
    absent = client.post(f"/incidents/{nowhere}/acknowledge", data={"by": "jane", "token": TOKEN})
    assert absent.status_code == 404
    assert f"There is no incident {nowhere}" in html.unescape(absent.text)
    done = client.post(
        f"/incidents/{number}/acknowledge",
        data={"by": "jane", "token": TOKEN, "back": "/incidents?state=open"},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == (
        f"/incidents?state=open&acknowledged={number}"
    )
    page = html.unescape(client.get(done.headers["location"]).text)
    assert f"Incident {number} on pump-1 is acknowledged by jane" in page
    assert 'name="token"' not in page  # asked once: the session keeps it
    incident = client.get(f"/v1/incidents/{number}", headers=headers).json()
    assert incident["acknowledged_by"] == "jane"
    alarms = client.get("/v1/alarms", params={"stream": "pump-1"}, headers=headers).json()
    assert {a["acknowledged_by"] for a in alarms["items"] if a["incident"] == number} == {"jane"}
