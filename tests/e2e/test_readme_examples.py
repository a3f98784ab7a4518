"""The README's API examples run as written against a real `twinwatch serve` (its defaults: the
shipped models, SQLite): each `curl` of the sections below is sent as it stands, in order, and
must succeed. The alarms section's acknowledgement names an alarm by example (42): it must get
a problem answer, not a crash."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import ROOT, ServeProcess, as_a_user_runs_it

README = ROOT / "README.md"
SECTIONS = ("## The API in brief", "## Streams that learn", "## Reading and acknowledging alarms")
EXAMPLE_IDS = re.compile(r"/v1/alarms/42/")  # an alarm named by example


def blocks(section: str) -> list[str]:
    text = README.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    return re.findall(r"```sh\n(.*?)```", text[start : end if end > 0 else None], re.S)


def commands(block: str) -> list[list[str]]:
    """Each curl of a shell block, as its words (continuations joined, comments dropped)."""
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    out: list[list[str]] = []
    for word in words:
        if word == "curl":
            out.append([])
        elif out:
            out[-1].append(word)
    return out


def send(client: httpx.Client, base: str, words: list[str]) -> httpx.Response:
    method, data, url = "GET", None, ""
    headers: dict[str, str] = {}
    position = 0
    while position < len(words):
        word = words[position]
        if word == "-X":
            method, position = words[position + 1], position + 2
        elif word == "-H":
            name, _, value = words[position + 1].partition(":")
            headers[name.strip()] = value.strip()
            position += 2
        elif word == "-d":
            data, position = words[position + 1], position + 2
        else:
            url, position = word, position + 1
    assert url.startswith("http://127.0.0.1:8000/"), words
    return client.request(
        method, url.replace("http://127.0.0.1:8000", base), headers=headers, content=data
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    serve = as_a_user_runs_it("readme", tmp_path)
    serve.start()
    yield serve
    serve.kill()


def test_the_readme_api_examples_run_as_written(server: ServeProcess) -> None:
    sent = 0
    with httpx.Client(timeout=60) as client:
        for section in SECTIONS:
            for block in blocks(section):
                for words in commands(block):
                    answer = send(client, server.base_url, words)
                    sent += 1
                    if any(EXAMPLE_IDS.search(word) for word in words):
                        assert answer.status_code == 404, answer.text
                        assert answer.headers["content-type"] == "application/problem+json"
                    else:
                        assert answer.is_success, (words, answer.status_code, answer.text)
    assert sent >= 8
