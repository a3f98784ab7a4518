"""The twin client against the real service (SQLite, and PostgreSQL when configured).

In-process tests drive `run_twin` through a TestClient with an injected clock; the process tests
run `twinwatch twin` against a uvicorn server on a loopback port and stop it with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from app.errors import ConflictError
from app.main import create_app
from app.settings import Settings
from app.storage.db import Database
from app.twin.client import Batch, ServiceClient, run_twin
from app.twin.schedule import Scenario, Timeline
from tests.integration.conftest import AppFactory, fake_loader

NOW = datetime(2026, 3, 1, tzinfo=UTC)
TOKEN = "s3cret-token-of-32-characters-ok"
SPIKE_AT = 40


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += max(0.0, seconds)
        return False


def spiky(n: int = 120) -> Scenario:
    """A quiet sensor with one +3 spike: the fake (persistence) model's point detector sees it."""
    values = 1.0 + 0.01 * np.sin(np.arange(n))
    if n > SPIKE_AT:
        values[SPIKE_AT] += 3.0
    return Scenario(start=1000, values=values, references=values.copy(), faults=(), seed=0)


def send(
    client: TestClient,
    stream: str,
    scenario: Scenario,
    service: ServiceClient | None = None,
    **kwargs: object,
) -> object:
    """The scenario sent by the twin, through `service` (by default the HTTP client)."""
    clock = FakeClock()
    token = kwargs.pop("token", None)
    return run_twin(
        service or ServiceClient("http://testserver", http=client, token=token),  # type: ignore[arg-type]
        stream,
        scenario,
        Timeline(samples=scenario.samples, rate_hz=10.0, speed=5.0),
        stop=threading.Event(),
        clock=clock,
        now_utc=lambda: NOW,
        wait=clock.wait,
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_twin_streams_into_the_service_and_its_alarm_is_persisted(
    client: TestClient,
) -> None:
    batches: list[Batch] = []
    report = send(client, "pump-1", spiky(), on_batch=batches.append)
    assert report.sent == report.accepted == 120  # type: ignore[attr-defined]
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["has_reference"] is True and stream["samples_seen"] == 120
    alarms = client.get("/v1/alarms", params={"stream": "pump-1"}).json()["items"]
    point = [a for a in alarms if a["detector"] == "point"]
    assert len(point) == 1 and point[0]["opened_sample"] == SPIKE_AT
    assert point[0]["state"] == "closed"  # the spike passed; 20 quiet samples closed it
    opened_ids = {a["id"] for a in report.opened}  # type: ignore[attr-defined]
    assert point[0]["id"] in opened_ids  # the twin saw the same alarm in its answers
    results = [r for b in batches for r in b.answer["results"]]
    assert len(results) == 120 and results[-1]["residual"] is not None


def test_a_second_run_continues_the_stream_after_its_readings(client: TestClient) -> None:
    send(client, "pump-1", spiky(30))
    report = send(client, "pump-1", spiky(30))
    assert report.accepted == 30 and report.duplicates == 0  # type: ignore[attr-defined]
    assert client.get("/v1/streams/pump-1").json()["samples_seen"] == 60


def test_a_looping_twin_pauses_between_cycles_and_the_service_accepts_every_cycle(
    client: TestClient,
) -> None:
    ramp = 1.0 + 0.1 * np.arange(30)  # ends 2.9 above where it starts
    scenario = Scenario(start=0, values=ramp, references=ramp.copy(), faults=(), seed=0)
    stop = threading.Event()
    clock = FakeClock()

    def two_cycles(batch: Batch) -> None:
        if batch.first >= 2 * scenario.samples - 1:
            stop.set()

    report = run_twin(
        ServiceClient("http://testserver", http=client),
        "pump-1",
        scenario,
        Timeline(samples=30, rate_hz=10.0, loop=True),
        stop=stop,
        clock=clock,
        now_utc=lambda: NOW,
        wait=clock.wait,
        on_batch=two_cycles,
    )
    assert report.accepted == 60 and report.stopped
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["samples_seen"] == 60
    # The pause between cycles is a gap: the stream warms up again (8 readings for the fake
    # model), so the jump back to the first sample raises no alarm.
    alarms = client.get("/v1/alarms", params={"stream": "pump-1"}).json()["items"]
    assert [a["opened_sample"] for a in alarms if a["detector"] == "point"] == []


def test_a_batch_resent_after_a_lost_answer_is_not_processed_twice(
    client: TestClient, database: Database
) -> None:
    scenario = spiky(60)
    with ServiceClient("http://testserver", http=client) as service:
        service.put_stream("pump-1", {"sample_period_s": 0.1, "has_reference": True})
        timeline = Timeline(samples=60, rate_hz=10.0)
        from app.twin.client import readings_of

        readings = readings_of(scenario, timeline, range(0, 60), NOW)
        first = service.post_readings("pump-1", readings)
        again = service.post_readings("pump-1", readings)  # the client never saw `first`
    assert (first["accepted"], first["duplicates"]) == (60, 0)
    assert (again["accepted"], again["duplicates"]) == (0, 60)
    alarms = client.get("/v1/alarms", params={"stream": "pump-1"}).json()["items"]
    assert len([a for a in alarms if a["detector"] == "point"]) == 1


def test_a_changed_reading_is_a_hard_409(client: TestClient) -> None:
    scenario = spiky(10)
    with ServiceClient("http://testserver", http=client) as service:
        service.put_stream("pump-1", {"sample_period_s": 0.1, "has_reference": True})
        from app.twin.client import readings_of

        readings = readings_of(scenario, Timeline(samples=10, rate_hz=10.0), range(10), NOW)
        service.post_readings("pump-1", readings)
        readings[3] = {**readings[3], "value": 99.0}
        with pytest.raises(ConflictError, match=r"409.*another value"):
            service.post_readings("pump-1", readings)


def test_the_token_is_required_and_accepted(make_client: AppFactory) -> None:
    guarded = make_client(api_token=TOKEN)
    from app.errors import UnauthorizedError

    with pytest.raises(UnauthorizedError, match="--token"):
        send(guarded, "pump-1", spiky(5))
    report = send(guarded, "pump-2", spiky(5), token=TOKEN)
    assert report.accepted == 5  # type: ignore[attr-defined]


# --- `twinwatch twin` as a process --------------------------------------------------------------


@pytest.fixture
def live_server(database: Database, models_dir: Path, tmp_path: Path) -> Iterator[str]:
    """The app (fake models, the test database) served by uvicorn on a loopback port."""
    settings = Settings(
        database_url=database.url,
        models_dir=models_dir,
        default_model="lstm-seed0",
        data_dir=tmp_path / "data",
        migrate_on_start=False,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, artifact_loader=fake_loader), log_level="warning", lifespan="on"
        )
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def twin_process(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
    return subprocess.Popen(
        [sys.executable, "-c", "from app.cli import main; main()", "twin", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_stops_the_twin_cleanly_after_its_batch(live_server: str) -> None:
    process = twin_process(
        "--url", live_server, "--stream", "pump-1", "--start", "0", "--samples", "3000"
    )
    try:
        deadline = time.monotonic() + 60
        seen = 0
        while seen < 10 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            answer = httpx.get(f"{live_server}/v1/streams/pump-1")
            seen = answer.json()["samples_seen"] if answer.status_code == 200 else 0
        assert seen >= 10, "the twin did not start sending"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("stopped: sent ")
    sent = int(last.split()[2])
    # Everything the twin sent was acknowledged, and nothing else arrived.
    assert httpx.get(f"{live_server}/v1/streams/pump-1").json()["samples_seen"] == sent


def test_an_unreachable_service_is_a_one_line_error_after_bounded_retries() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = twin_process(
        "--url", f"http://127.0.0.1:{port}", "--samples", "10", "--attempts", "2"
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "error: GET stream twin failed 2 times, last with ConnectError" in output
    assert "Traceback" not in output
