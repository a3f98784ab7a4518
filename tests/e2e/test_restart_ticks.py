"""Gateway ticks of 64 and 600 streams through a real `twinwatch serve` killed with SIGKILL
twice: every stream continues bit for bit as on a server that never stopped.

The streams are restored from their checkpoints and the readings stored after them, one stream
at a time, while the live server processed them in ticks of hundreds of streams: the recurrence
gives the same numbers however streams and readings are grouped, and this test holds it to that
(exact equality, no tolerance). The subject is killed once right after a tick's answer and once
while a tick waits inside its transaction; the client re-sends what it has no answer for.
"""

from __future__ import annotations

import shutil
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.registry import SHIPPED_MODELS_DIR
from app.series import Series
from tests.e2e.conftest import E2E_BACKENDS, ServeProcess, new_database
from tests.e2e.test_restart import alarm_rows, transaction_blocker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "lstm-stateful-day-seed3"  # the default model: one LSTM step per reading
WARM = 300  # readings before the ticks (the model forecasts from its 256th)
TICKS = 60
KILL_AFTER_ANSWER = 20  # SIGKILL right after this tick's 2xx
KILL_IN_FLIGHT = 40  # SIGKILL while this tick waits inside its transaction
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    shutil.copytree(SHIPPED_MODELS_DIR / MODEL, directory / MODEL)
    return directory


def value(series: Series, stream: int, sample: int, streams: int) -> float:
    """Stream i reads the lab record from its own offset: the later ones meet its faults."""
    return float(series.value[5000 + (2400 // streams) * stream + sample])


def at(sample: int) -> str:
    return (T0 + timedelta(milliseconds=100 * sample)).isoformat()


def tick(series: Series, streams: int, sample: int) -> dict[str, Any]:
    return {
        "streams": [
            {
                "stream": f"s{i}",
                "readings": [{"t": at(sample), "value": value(series, i, sample, streams)}],
            }
            for i in range(streams)
        ]
    }


def warm_up(client: httpx.Client, series: Series, streams: int) -> None:
    """Every stream's first readings, many streams and readings in each request."""
    for first in range(0, streams, 25):
        body = {
            "streams": [
                {
                    "stream": f"s{i}",
                    "readings": [
                        {"t": at(s), "value": value(series, i, s, streams)} for s in range(WARM)
                    ],
                }
                for i in range(first, min(streams, first + 25))
            ]
        }
        response = client.post("/v1/readings", json=body)
        assert response.status_code == 200, response.text


@dataclass
class Run:
    results: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    def record(self, answer: dict[str, Any], sample: int) -> None:
        for item in answer["streams"]:
            if item["accepted"]:
                (result,) = item["results"]
                key = (int(item["stream"][1:]), sample)
                assert key not in self.results, f"{key} processed twice"
                self.results[key] = result


def start(name: str, url: str, models: Path, log_dir: Path) -> ServeProcess:
    server = ServeProcess(name, database_url=url, models_dir=models, log_dir=log_dir)
    server.env["TWINWATCH_DEFAULT_MODEL"] = MODEL
    server.env["TWINWATCH_CHECKPOINT_EVERY"] = "97"  # restores replay readings after one
    server.start()
    return server


def client_of(server: ServeProcess, streams: int, *, create: bool = False) -> httpx.Client:
    client = httpx.Client(base_url=server.base_url, timeout=120.0)
    if create:
        for i in range(streams):
            assert client.put(f"/v1/streams/s{i}", json={}).status_code == 201
    return client


def post_tick(client: httpx.Client, series: Series, streams: int, sample: int) -> dict[str, Any]:
    response = client.post("/v1/readings", json=tick(series, streams, sample))
    assert response.status_code == 200, response.text
    return dict(response.json())


def kill_in_flight(server: ServeProcess, backend: str, url: str, body: dict[str, Any]) -> None:
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["response"] = httpx.post(
                f"{server.base_url}/v1/readings", json=body, timeout=60
            )
        except httpx.TransportError as exc:
            outcome["error"] = exc

    with transaction_blocker(backend, url, stream="s0") as wait_until_blocked:
        sender = threading.Thread(target=send)
        sender.start()
        wait_until_blocked()
        server.kill()
        sender.join(timeout=60)
    assert "response" not in outcome, f"answered although it could not commit: {outcome}"


@pytest.mark.parametrize("streams", [64, 600])
@pytest.mark.parametrize("backend", E2E_BACKENDS)
def test_ticks_continue_exactly_after_sigkills(
    backend: str,
    streams: int,
    models: Path,
    databases: ExitStack,
    seed0_lab: Series,
    tmp_path: Path,
) -> None:
    reference_url = new_database(databases, backend, tmp_path)
    subject_url = new_database(databases, backend, tmp_path)
    reference = start("reference", reference_url, models, tmp_path)
    try:
        client = client_of(reference, streams, create=True)
        warm_up(client, seed0_lab, streams)
        expected = Run()
        for sample in range(WARM, WARM + TICKS):
            expected.record(post_tick(client, seed0_lab, streams, sample), sample)
        client.close()
    finally:
        reference.stop()

    subject = start("subject", subject_url, models, tmp_path)
    try:
        client = client_of(subject, streams, create=True)
        warm_up(client, seed0_lab, streams)
        actual, restarts = Run(), 0
        for sample in range(WARM, WARM + TICKS):
            if sample == WARM + KILL_IN_FLIGHT:
                client.close()
                kill_in_flight(subject, backend, subject_url, tick(seed0_lab, streams, sample))
                subject.start()
                restarts += 1
                client = client_of(subject, streams)
            actual.record(post_tick(client, seed0_lab, streams, sample), sample)
            if sample == WARM + KILL_AFTER_ANSWER:
                client.close()
                subject.kill()
                subject.start()
                restarts += 1
                client = client_of(subject, streams)
                again = post_tick(client, seed0_lab, streams, sample)  # a lost answer re-sent
                assert all(item["duplicates"] == 1 for item in again["streams"])
        client.close()
    finally:
        subject.stop()

    assert restarts == 2
    assert sorted(actual.results) == sorted(expected.results)
    for key, result in expected.results.items():
        assert actual.results[key] == result, key  # exactly: not a bit of difference
    warm = [r for r in expected.results.values() if r["forecast"] is not None]
    assert len(warm) == streams * TICKS  # every tick was forecast and monitored
    assert alarm_rows(subject_url) == alarm_rows(reference_url)
    assert alarm_rows(reference_url), "the later streams meet the lab's faults"
