"""The operator's pages that act or are guarded: the alarms page and its acknowledgement (a
name, and the API token once when the service requires one, kept in the session cookie), the
sign-in page when reads are protected, and the stream page. Refusals are pages that say why;
nothing is acknowledged by a refused form."""

from __future__ import annotations

import html
import re
from datetime import datetime

from fastapi.testclient import TestClient
from httpx import Response

from app.storage.db import Database
from tests.integration.conftest import AppFactory, make_alarm, make_stream

TOKEN = "s3cret-token-of-32-characters-ok"
READ_TOKEN = "read-only-token-of-32-characters"


def said(answer: Response) -> str:
    """A page's text as a reader sees it (entities unescaped)."""
    return html.unescape(answer.text)


def alarm_rows(html: str) -> list[int]:
    return [int(found) for found in re.findall(r'<tr data-alarm="(\d+)"', html)]


def seeded(database: Database) -> dict[str, int]:
    """pump-1: a closed point alarm at 100 and an open cusum alarm at 250; pump-2: a closed
    point alarm at 150."""
    with database.session() as session:
        make_stream(session, "pump-1")
        make_stream(session, "pump-2")
        return {
            "point": make_alarm(session, "pump-1", sample=100).id,
            "cusum": make_alarm(
                session, "pump-1", detector="cusum", sample=250, closed_after=None
            ).id,
            "other": make_alarm(session, "pump-2", sample=150).id,
        }


def acknowledged_by(
    client: TestClient, alarm_id: int, headers: dict[str, str] | None = None
) -> str | None:
    answer = client.get(f"/v1/alarms/{alarm_id}", headers=headers or {})
    assert answer.status_code == 200, answer.text
    by = answer.json()["acknowledged_by"]
    return None if by is None else str(by)


def test_the_alarms_page_filters_and_links_each_alarm_to_its_moment(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    ids = seeded(database)
    page = client.get("/alarms")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert alarm_rows(page.text) == [ids["cusum"], ids["other"], ids["point"]]
    assert alarm_rows(client.get("/alarms", params={"stream": "pump-2"}).text) == [ids["other"]]
    assert alarm_rows(client.get("/alarms", params={"detector": "cusum"}).text) == [ids["cusum"]]
    assert alarm_rows(client.get("/alarms", params={"state": "closed"}).text) == [
        ids["other"],
        ids["point"],
    ]
    assert alarm_rows(client.get("/alarms", params={"stream": "pump-1", "state": "open"}).text) == [
        ids["cusum"]
    ]
    assert "No alarm matches these filters" in client.get("/alarms?stream=nothing").text
    # The link to the chart names the moment the alarm opened (epoch seconds).
    opened = client.get(f"/v1/alarms/{ids['point']}").json()["opened_at"]
    (moment,) = re.findall(
        rf'/streams/pump-1\?at=([0-9.]+)#chart" aria-label="Alarm {ids["point"]}', page.text
    )
    assert abs(float(moment) - _epoch(opened)) < 1e-3
    # No token configured: no token field.
    assert 'name="token"' not in page.text
    assert client.get("/alarms", params={"state": "sideways"}).status_code == 422


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_the_alarms_page_pages_with_its_filters(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    with database.session() as session:
        make_stream(session, "pump-1")
        made = [make_alarm(session, "pump-1", sample=10 * index).id for index in range(1, 56)]
    first = client.get("/alarms", params={"stream": "pump-1"})
    assert alarm_rows(first.text) == made[::-1][:50]
    (cursor,) = re.findall(r'stream=pump-1&amp;cursor=([^"&]+)"', first.text)
    second = client.get(f"/alarms?stream=pump-1&cursor={cursor}")
    assert alarm_rows(second.text) == made[::-1][50:]


def test_acknowledging_on_the_page_without_a_token_configured(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    ids = seeded(database)
    answer = client.post(
        f"/alarms/{ids['point']}/acknowledge",
        data={"by": "  jane  ", "back": "/alarms?stream=pump-1"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/alarms?stream=pump-1&acknowledged={ids['point']}"
    assert acknowledged_by(client, ids["point"]) == "jane"
    shown = client.get(answer.headers["location"])
    assert f"Alarm {ids['point']} on pump-1 is acknowledged by jane." in shown.text
    # The name is remembered for the next form.
    assert 'value="jane" required' in shown.text
    # The first acknowledgement is kept.
    client.post(f"/alarms/{ids['point']}/acknowledge", data={"by": "bob"})
    assert acknowledged_by(client, ids["point"]) == "jane"
    # The next one, from the page the first returned to, says only the latest.
    second = client.post(
        f"/alarms/{ids['cusum']}/acknowledge",
        data={"by": "jane", "back": answer.headers["location"]},
        follow_redirects=False,
    )
    assert second.headers["location"] == f"/alarms?stream=pump-1&acknowledged={ids['cusum']}"
    assert client.get(second.headers["location"]).status_code == 200
    # An alarm no one acknowledged is not said to be.
    unacknowledged = said(client.get(f"/alarms?acknowledged={ids['other']}"))
    assert "is acknowledged by" not in unacknowledged


def test_a_page_form_refuses_what_it_cannot_do(make_client: AppFactory, database: Database) -> None:
    client = make_client()
    ids = seeded(database)
    blank = client.post(f"/alarms/{ids['point']}/acknowledge", data={"by": "   "})
    assert blank.status_code == 422 and "Give a name" in said(blank)
    missing = client.post("/alarms/999999/acknowledge", data={"by": "jane"})
    assert missing.status_code == 404 and "There is no alarm 999999." in said(missing)
    foreign = client.post(
        f"/alarms/{ids['point']}/acknowledge",
        data={"by": "mallory"},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403 and "another site" in said(foreign)
    # The return address stays on this service.
    away = client.post(
        f"/alarms/{ids['other']}/acknowledge",
        data={"by": "jane", "back": "//evil.example/alarms"},
        follow_redirects=False,
    )
    assert away.headers["location"] == f"/alarms?acknowledged={ids['other']}"
    assert acknowledged_by(client, ids["point"]) is None
    assert client.post("/alarms/0/acknowledge", data={"by": "x"}).status_code == 422
    too_long = client.post(f"/alarms/{ids['point']}/acknowledge", data={"by": "j" * 129})
    assert too_long.status_code == 422 and "1 to 128 characters" in said(too_long)


def test_with_a_token_the_page_asks_for_it_once(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(api_token=TOKEN)
    ids = seeded(database)
    page = client.get("/alarms")
    assert page.text.count('name="token"') == 3
    without = client.post(f"/alarms/{ids['point']}/acknowledge", data={"by": "jane"})
    assert without.status_code == 401
    assert "Acknowledging needs this service's API token" in said(without)
    wrong = client.post(
        f"/alarms/{ids['point']}/acknowledge", data={"by": "jane", "token": "not-the-token"}
    )
    assert wrong.status_code == 401 and "That is not this service's API token" in said(wrong)
    assert acknowledged_by(client, ids["point"]) is None
    # The name typed is kept for the next try; whether an alarm exists is not said before.
    assert 'value="jane" required' in without.text
    assert client.post("/alarms/999999/acknowledge", data={"by": "jane"}).status_code == 401

    right = client.post(
        f"/alarms/{ids['point']}/acknowledge",
        data={"by": "jane", "token": TOKEN},
        follow_redirects=False,
    )
    assert right.status_code == 303
    cookie = right.headers["set-cookie"]
    assert "twinwatch_token=" in cookie and "HttpOnly" in cookie
    assert "samesite=lax" in cookie.lower()
    assert TOKEN not in right.headers["location"]
    assert acknowledged_by(client, ids["point"]) == "jane"
    # Kept for the session: no token field any more, the next acknowledgement needs none.
    assert 'name="token"' not in client.get("/alarms").text
    again = client.post(f"/alarms/{ids['cusum']}/acknowledge", data={"by": "jane"})
    assert again.status_code == 200 and acknowledged_by(client, ids["cusum"]) == "jane"
    # The API's writes still need the bearer header: the cookie does not stand for it.
    api = client.post(f"/v1/alarms/{ids['other']}/acknowledge", json={"by": "jane"})
    assert api.status_code == 401
    # Signing out forgets it.
    client.post("/sign-out")
    assert client.get("/alarms").text.count('name="token"') == 1


def test_protected_reads_ask_the_browser_to_sign_in(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(api_token=TOKEN, read_token=READ_TOKEN)
    seeded(database)
    for path in ("/", "/alarms?stream=pump-1", "/streams/pump-1", "/streams/pump-1/facts"):
        answer = client.get(path)
        assert answer.status_code == 401 and "Sign in" in answer.text, path
        assert f'name="back" value="{path}"'.replace("&", "&amp;") in answer.text
    assert client.get("/v1/streams").status_code == 401
    assert client.post("/sign-in", data={"token": "wrong", "back": "/"}).status_code == 401
    assert client.post("/sign-in", data={"token": "", "back": "/"}).status_code == 401
    signed = client.post(
        "/sign-in",
        data={"token": READ_TOKEN, "back": "/alarms?stream=pump-1"},
        follow_redirects=False,
    )
    assert signed.status_code == 303 and signed.headers["location"] == "/alarms?stream=pump-1"
    assert client.get("/alarms?stream=pump-1").status_code == 200
    assert client.get("/streams/pump-1").status_code == 200
    # The chart's fetches (the API's reads) and the API's documents take the session too.
    assert client.get("/v1/streams/pump-1/readings").status_code == 200
    assert client.get("/docs").status_code == 200
    # A read token does not acknowledge.
    alarms = client.get("/alarms").text
    assert 'name="token"' in alarms
    # Elsewhere is never a return address.
    client.post("/sign-out")
    for back in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        away = client.post(
            "/sign-in", data={"token": READ_TOKEN, "back": back}, follow_redirects=False
        )
        assert away.headers["location"] == "/", back
    client.post("/sign-out")
    assert client.get("/").status_code == 401


def test_the_stream_page_shows_the_stream_and_its_alarms(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client()
    ids = seeded(database)
    page = client.get("/streams/pump-1")
    assert page.status_code == 200
    text = page.text
    assert "<h1>pump-1</h1>" in text
    assert 'id="plots"' in text and "/v1/streams/pump-1/readings" in text
    assert "vendor/uplot/uPlot.iife.min.js" in text
    assert alarm_rows(text) == [ids["cusum"], ids["point"]]
    assert "Shadowing candidate" not in text
    # What a page may do in a browser: nothing from elsewhere, in no other site's frame.
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    facts = client.get("/streams/pump-1/facts")
    assert facts.status_code == 200 and facts.text.lstrip().startswith("<dl")
    at = client.get("/streams/pump-1", params={"at": "1735689620"})
    assert 'data-at="1735689620.0"' in at.text and 'id="follow" >' in at.text
    missing = client.get("/streams/nothing-here")
    assert missing.status_code == 404 and "No stream “nothing-here”." in said(missing)
    # A name no stream can have names none (and reaches no query: a NUL byte would upset
    # PostgreSQL).
    for odd in ("a%00b", "a%20b", "x" * 200):
        for page_path in (f"/streams/{odd}", f"/streams/{odd}/facts", f"/streams/{odd}/shadow"):
            assert client.get(page_path).status_code == 404, page_path
    assert client.get("/streams/pump-1/shadow").status_code == 404  # it has no shadow
    assert "No alarm matches" in client.get("/alarms?stream=a%00b").text
    assert "No alarm matches" in client.get("/alarms?detector=%00").text
    assert client.get("/streams/pump-1", params={"at": "yesterday"}).status_code == 422
    # Everything it links to is served here.
    for asset in re.findall(r'(?:src|href)="(http://testserver/static/[^"]+)"', text):
        assert client.get(asset).status_code == 200, asset


def test_the_stream_page_compares_a_shadowing_candidate(make_client: AppFactory) -> None:
    client = make_client()
    client.put("/v1/streams/pump-1", json={})
    flat = [{"t": 1.7e9 + i / 10, "value": 0.0} for i in range(60)]
    client.post("/v1/streams/pump-1/readings", json={"readings": flat})
    assert (
        client.put(
            "/v1/streams/pump-1/shadow", json={"name": "lstm-seed0", "version": 1}
        ).status_code
        == 200
    )
    swing = [{"t": 1.7e9 + i / 10, "value": 5.0 * (i % 2)} for i in range(60, 100)]
    client.post("/v1/streams/pump-1/readings", json={"readings": swing})
    page = said(client.get("/streams/pump-1"))
    assert "lstm-seed0 version 1 sees this stream's readings since" in page
    assert 'href="http://testserver/streams/pump-1/shadow"' in page
    # The comparison replays both versions: on its own page, not at every view of the stream.
    text = said(client.get("/streams/pump-1/shadow"))
    assert "over 40 readings since" in text
    rows = re.findall(
        r'<tr><th scope="row">(Runs|Candidate)</th>'
        r'<td>lstm-seed0 <span class="detail">version 1</span>',
        text,
    )
    assert rows == ["Runs", "Candidate"]


def test_with_reads_protected_acknowledging_needs_signing_in(
    make_client: AppFactory, database: Database
) -> None:
    client = make_client(read_token=READ_TOKEN)  # writes open, reads not
    ids = seeded(database)
    refused = client.post(f"/alarms/{ids['point']}/acknowledge", data={"by": "mallory"})
    assert refused.status_code == 401 and "Sign in" in refused.text
    assert "pump-1" not in refused.text  # no alarm shown to who may not read
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    assert acknowledged_by(client, ids["point"], headers) is None
    # A script reads the pages with the bearer header, as it reads the API.
    assert client.get("/alarms", headers=headers).status_code == 200
