"""The command line a user reaches for against a running service: `twinwatch send` feeds a CSV
(or standard input) to a stream, creating it as a learning stream if asked, and a re-send sends
nothing new; `streams`, `alarms` and `incidents` list and acknowledge. Bad input is a one-line
error, never a traceback or a half-sent file."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.cli import cli
from app.cli import models as models_cli
from app.errors import AppError
from tests.integration.conftest import AppFactory

START = 1_700_000_000.0


def csv_text(first: int, stop: int, *, spike_at: int | None = None) -> str:
    """A pump's flow and pressure once a second, a missing pressure now and then."""
    rng = np.random.default_rng(4)
    values = np.column_stack([30 + rng.normal(0, 0.5, stop), 5 + rng.normal(0, 0.1, stop)])
    if spike_at is not None:
        values[spike_at, 0] += 40
    lines = ["time,flow,pressure,anomaly"]
    for i in range(first, stop):
        pressure = "" if i % 97 == 5 else f"{values[i, 1]:.4f}"
        lines.append(f"{START + i:.0f},{values[i, 0]:.4f},{pressure},0")
    return "\n".join(lines) + "\n"


@pytest.fixture
def client(make_client: AppFactory, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    service = make_client(default_model="auto")
    monkeypatch.setattr(models_cli, "_client", lambda url: contextlib.nullcontext(service))
    return service


def run(*args: str, stdin: str | None = None) -> str:
    result = CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return " ".join("".join(c if c.isascii() else " " for c in result.output).split())


def test_send_creates_learns_resumes_and_the_lists_show_the_alarm(
    client: TestClient, tmp_path: Path
) -> None:
    readings = tmp_path / "pump.csv"
    readings.write_text(csv_text(0, 600))
    said = run("send", "pump-9", str(readings), "--create", "--learn", "300")
    assert "created stream pump-9 (model auto, channels flow, pressure)" in said
    assert "600 readings accepted, 0 already there, 0 skipped" in said
    stream = client.get("/v1/streams/pump-9").json()
    assert (stream["model"], stream["channels"], stream["samples_seen"]) == (
        "auto",
        ["flow", "pressure"],
        600,
    )
    # Sent again: nothing new. With more rows (a spike among them): only the new ones.
    assert "0 readings accepted, 0 already there, 600 skipped" in run(
        "send", "pump-9", str(readings)
    )
    deadline = time.monotonic() + 60
    while not client.get("/v1/streams/pump-9").json().get("learned_model"):
        assert time.monotonic() < deadline, "the stream did not learn"
        time.sleep(0.05)
    readings.write_text(csv_text(0, 900, spike_at=700))
    said = run("send", "pump-9", str(readings), "--batch", "100")
    assert "300 readings accepted, 0 already there, 600 skipped" in said

    assert re.search(r"pump-9 auto v\d monitoring 900 2023-11-14 22:28:19", run("streams", "list"))
    (alarm,) = [
        a
        for a in client.get("/v1/alarms", params={"stream": "pump-9"}).json()["items"]
        if (a["opened_sample"], a["detector"]) == (700, "point")
    ]
    assert f"{alarm['id']} pump-9 point" in run("alarms", "list", "--stream", "pump-9")
    assert f"alarm {alarm['id']} acknowledged by jane" in run(
        "alarms", "ack", str(alarm["id"]), "--by", "jane"
    )
    incident = alarm["incident"]
    assert f"{incident} pump-9" in run("incidents", "list", "--stream", "pump-9")
    assert f"incident {incident} acknowledged by jane" in run(
        "incidents", "ack", str(incident), "--by", "jane"
    )


def test_send_reads_standard_input_into_a_stream_of_one_channel(client: TestClient) -> None:
    client.put("/v1/streams/one", json={"model": "auto"})
    text = "t,temperature\n" + "".join(
        f"2026-01-01T00:00:{i:02d}Z,{20 + 0.1 * i}\n" for i in range(30)
    )
    assert "30 readings accepted" in run("send", "one", "-", stdin=text)
    assert client.get("/v1/streams/one").json()["samples_seen"] == 30


def test_bad_input_is_one_clear_error_and_sends_nothing(client: TestClient, tmp_path: Path) -> None:
    readings = tmp_path / "pump.csv"
    readings.write_text(csv_text(0, 10))
    runner = CliRunner()

    def refused(*args: str) -> str:
        with pytest.raises(AppError) as raised:
            runner.invoke(cli, list(args), catch_exceptions=False)
        return raised.value.detail

    assert refused("send", "nobody", str(readings)) == (
        "stream 'nobody' does not exist: pass --create to create it"
    )
    readings.write_text("time,flow\n1700000000,1.0\n1700000001,lots\n")
    assert refused("send", "p", str(readings), "--create") == (
        "line 3, column 'flow': 'lots' is not a number"
    )
    assert client.get("/v1/streams/p").status_code == 404  # checked before anything is sent
    assert refused("send", "p", str(tmp_path / "absent.csv")).startswith("cannot read")
    readings.write_text("time,flow\nyesterday,1.0\n")
    assert "is not a time" in refused("send", "p", str(readings), "--create")
    client.put("/v1/streams/two", json={"model": "auto", "channels": ["a", "b"]})
    readings.write_text("time,a,c\n1700000000,1,2\n")
    assert refused("send", "two", str(readings)) == (
        "the CSV's columns ['a', 'c'] are not stream 'two''s channels ['a', 'b']"
    )


def test_send_refuses_times_and_files_the_service_would(client: TestClient, tmp_path: Path) -> None:
    """Checked as the service checks them, before anything is sent: no traceback, no stream."""
    readings = tmp_path / "pump.csv"
    runner = CliRunner()

    def refused(text: str | bytes) -> str:
        if isinstance(text, bytes):
            readings.write_bytes(text)
        else:
            readings.write_text(text)
        with pytest.raises(AppError) as raised:
            runner.invoke(cli, ["send", "q", str(readings), "--create"], catch_exceptions=False)
        return raised.value.detail

    assert "milliseconds?" in refused("time,flow\n1700000000000,1.0\n")
    assert "'nan' is not a time" in refused("time,flow\nnan,1.0\n")
    assert "'inf' is not a time" in refused("time,flow\ninf,1.0\n")
    assert "before 1990" in refused("time,flow\n0,1.0\n1,2.0\n")  # since a recording began
    assert "is not UTF-8 text" in refused(b"time,flow\n1700000000,\xff\n")
    assert client.get("/v1/streams/q").status_code == 404
    # Without an offset, a time is UTC, and sent as such.
    readings.write_text("time,flow\n2026-01-01T00:00:00,1.0\n2026-01-01 00:00:01,2.0\n")
    assert "2 readings accepted" in run("send", "q", str(readings), "--create")
    last = client.get("/v1/streams/q").json()["last_t"]
    assert last.startswith("2026-01-01T00:00:01")


def test_streams_apply_onboards_a_fleet_from_json_or_csv(
    client: TestClient, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text('{"streams": [{"id": "a-1", "model": "auto"}, {"id": "a-2"}]}')
    assert "2 created, 0 updated" in run("streams", "apply", str(fleet))
    inventory = tmp_path / "fleet.csv"
    inventory.write_text(
        "id,model,channels,sample_period_s,has_reference\n"
        "a-2,auto,flow pressure,60,false\n"
        "b-1,,,,\n"
    )
    assert "1 created, 1 updated" in run("streams", "apply", str(inventory))
    a2 = client.get("/v1/streams/a-2").json()
    assert (a2["channels"], a2["sample_period_s"]) == (["flow", "pressure"], 60.0)
    assert "1 created" in run("streams", "apply", "-", stdin='[{"id": "c-1"}]')

    def refused(*args: str, stdin: str | None = None) -> str:
        with pytest.raises(AppError) as raised:
            CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)
        return raised.value.detail

    assert "not JSON" in refused("streams", "apply", "-", stdin="[{")
    bad = '[{"id": "d-1"}, {"id": "d-2", "model": "nothing-like-it"}]'
    assert "stream 'd-2'" in refused("streams", "apply", "-", stdin=bad)
    assert client.get("/v1/streams/d-1").status_code == 404  # all or nothing
    inventory.write_text("id,colour\nx,red\n")
    assert "not colour" in refused("streams", "apply", str(inventory))
