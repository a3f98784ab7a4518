"""The operator's streams page in a real browser: Debian's chromium, driven by Playwright (its
own browser download is not used), against a real `twinwatch serve`. A learning stream shows
its progress, then monitoring under the model it learned; the filter works; the page is usable
from the keyboard, fetches nothing from elsewhere, and follows the light and dark schemes.

Needs Debian's `chromium` (CI installs it); skipped, saying so, where it is missing. With
TWINWATCH_SCREENSHOTS set to a directory, the page's screenshot is written there
(docs/images/ holds the README's).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import ServerFactory, new_database
from tests.support.models import epoch_times, lab_series

CHROMIUM = shutil.which("chromium")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"
)


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def readings(first: int, stop: int) -> dict[str, Any]:
    times = epoch_times(first, stop)
    values = lab_series().value[first:stop]
    return {
        "readings": [{"t": float(t), "value": float(v)} for t, v in zip(times, values, strict=True)]
    }


def test_the_streams_page_in_a_browser(
    make_server: ServerFactory, databases: Any, tmp_path: Path, browser: Any
) -> None:
    server = make_server("pages", new_database(databases, "sqlite", tmp_path))
    server.start()
    api = httpx.Client(base_url=server.base_url, timeout=60)
    api.put("/v1/streams/pump-1", json={"model": "auto", "learning": {"readings": 300}})
    api.put("/v1/streams/fan-2", json={"model": "lstm-seed0"})

    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(server.base_url + "/")
    row = page.locator('tr[data-stream="pump-1"]')
    assert row.locator(".state").inner_text() == "learning"
    assert "300 readings to go" in row.inner_text()
    assert page.locator("table caption").inner_text() == "2 streams on this page"

    # It learns: after a reload it monitors, under version 1 of what it learned.
    assert api.post("/v1/streams/pump-1/readings", json=readings(0, 1000)).status_code == 200
    deadline = time.monotonic() + 60
    while api.get("/v1/streams/pump-1").json()["phase"] != "monitoring":
        assert time.monotonic() < deadline, "the stream did not learn"
        time.sleep(0.2)
    page.reload()
    assert row.locator(".state").inner_text() == "monitoring"
    assert "auto.pump-1" in row.inner_text() and "version 1" in row.inner_text()
    assert "1,000" in row.inner_text()

    # The filter, from the keyboard: the skip link first, then the search field.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the content"
    page.locator("#q").focus()
    page.keyboard.type("fan")
    page.keyboard.press("Enter")
    page.wait_for_url("**/?q=fan")
    assert page.locator("tbody tr").count() == 1
    assert page.locator('tr[data-stream="fan-2"]').count() == 1
    page.get_by_role("link", name="Show all").click()
    assert page.locator("tbody tr").count() == 2

    # Both colour schemes, nothing fetched from elsewhere.
    background = "getComputedStyle(document.body).backgroundColor"
    page.emulate_media(color_scheme="light")
    assert page.evaluate(background) == "rgb(255, 255, 255)"
    page.emulate_media(color_scheme="dark")
    assert page.evaluate(background) == "rgb(13, 17, 23)"
    assert requested and all(url.startswith(server.base_url) for url in requested), requested

    shots = os.environ.get("TWINWATCH_SCREENSHOTS")
    if shots:
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": 1100, "height": 420})
        page.screenshot(path=str(Path(shots) / "streams.png"))
    server.stop()
