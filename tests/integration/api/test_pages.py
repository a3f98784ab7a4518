"""The operator's streams page over HTTP: the streams with their state, a page at a time,
filtered by id prefix; bad input answers a clear 4xx, never a 500."""

from __future__ import annotations

import re

from tests.integration.conftest import AppFactory


def test_the_streams_page_pages_and_filters(make_client: AppFactory) -> None:
    client = make_client(default_model="auto")
    for index in range(55):
        client.put(f"/v1/streams/pump-{index:02d}", json={"learning": {"readings": 100}})
    client.put("/v1/streams/fan", json={"model": "lstm-seed0"})
    first = client.get("/")
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/html")
    rows = re.findall(r'<tr data-stream="([^"]+)"', first.text)
    assert rows[:2] == ["fan", "pump-00"] and len(rows) == 50
    assert "learning" in first.text and "100 readings to go" in first.text
    (cursor,) = re.findall(r'cursor=([^"&]+)"', first.text)
    second = client.get(f"/?cursor={cursor}")
    assert re.findall(r'<tr data-stream="([^"]+)"', second.text) == [
        f"pump-{index:02d}" for index in range(49, 55)
    ]
    filtered = client.get("/", params={"q": "pump-5"})
    assert re.findall(r'<tr data-stream="([^"]+)"', filtered.text) == [
        f"pump-{index:02d}" for index in range(50, 55)
    ]
    # A prefix is text, not a pattern.
    assert "No stream whose id starts with" in client.get("/", params={"q": "pump_%"}).text


def test_bad_page_parameters_are_refused_clearly(make_client: AppFactory) -> None:
    client = make_client()
    bad_cursor = client.get("/", params={"cursor": "%%%"})
    assert bad_cursor.status_code == 422
    assert bad_cursor.headers["content-type"] == "application/problem+json"
    assert client.get("/", params={"q": "x" * 200}).status_code == 422
    assert client.get("/", params=[("q", "a"), ("q", "b")]).status_code == 422
