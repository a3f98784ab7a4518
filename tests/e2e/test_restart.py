"""A real `twinwatch serve` killed with SIGKILL mid-stream continues exactly as if it had not.

The lab's series (samples 6000..7999 of seed 0 with its four faults, the redundant sensor as
reference) is streamed through two server processes on two fresh databases: the reference runs
without interruption; the subject is killed twice, once right after the 2xx of a batch and once
while a batch waits inside its database transaction (the test holds a lock the transaction
needs), and each time restarted on the same database. The client re-sends what it has no answer
for together with an acknowledged batch, as a retrying client would. Every result (forecast,
residual, detector statistics), every forecast from `GET .../forecast` and every alarm row in the
database must match the reference, exactly: the restarted server replays the stored readings
in other groupings than they arrived in, and the recurrence gives the same bits whatever the
grouping.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from app.series import Series
from app.storage.db import Database
from app.storage.models import Alarm
from tests.e2e.conftest import E2E_BACKENDS, ServeProcess, ServerFactory, new_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STREAM = "mount-1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
FIRST_SAMPLE, END_SAMPLE = 6000, 8000
# Warm-up and normal data in batches of 100, the faulted thousand in batches of 50.
BATCHES = [(a, a + 100) for a in range(6000, 7000, 100)] + [
    (a, a + 50) for a in range(7000, 8000, 50)
]
KILL_AFTER_ANSWER = (7300, 7350)  # SIGKILL right after this batch's 2xx (the offset fault)
KILL_IN_FLIGHT = (7600, 7650)  # SIGKILL while this batch is inside its transaction (excitation)
TOLERANCE = 0.0  # exactly: the recurrence gives the same bits however readings are grouped
SQLITE_GRACE_S = 1.0  # for the in-flight batch to reach its (blocked) first write


def at(sample: int) -> datetime:
    return T0 + timedelta(milliseconds=100 * sample)


def payload(series: Series, start: int, stop: int) -> dict[str, Any]:
    assert series.reference is not None
    return {
        "readings": [
            {
                "t": at(i).isoformat(),
                "value": float(series.value[i]),
                "reference": float(series.reference[i]),
            }
            for i in range(start, stop)
        ]
    }


@dataclass
class Run:
    """What a client saw: results by sample, forecasts by the batch end they followed."""

    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    forecasts: dict[int, list[float]] = field(default_factory=dict)
    stream: dict[str, Any] = field(default_factory=dict)


def client_for(server: ServeProcess) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=60.0)


def create_stream(client: httpx.Client) -> None:
    response = client.put(f"/v1/streams/{STREAM}", json={"has_reference": True})
    assert response.status_code == 201, response.text


def post(client: httpx.Client, series: Series, start: int, stop: int) -> httpx.Response:
    return client.post(f"/v1/streams/{STREAM}/readings", json=payload(series, start, stop))


def record(run: Run, answer: dict[str, Any], start: int, stop: int) -> None:
    """File the answer's results under their samples; re-sent readings come first and get none."""
    first = start + answer["duplicates"]
    assert answer["accepted"] == stop - first
    assert len(answer["results"]) == stop - first
    for offset, result in enumerate(answer["results"]):
        sample = first + offset
        assert datetime.fromisoformat(result["t"]) == at(sample)
        assert sample not in run.results, f"sample {sample} processed twice"
        run.results[sample] = result


def forecast(client: httpx.Client) -> list[float]:
    response = client.get(f"/v1/streams/{STREAM}/forecast")
    assert response.status_code == 200, response.text
    return list(response.json()["forecast"])


def stream_view(client: httpx.Client) -> dict[str, Any]:
    response = client.get(f"/v1/streams/{STREAM}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def stream_reference(server: ServeProcess, series: Series) -> Run:
    run = Run()
    with client_for(server) as client:
        create_stream(client)
        for start, stop in BATCHES:
            response = post(client, series, start, stop)
            assert response.status_code == 200, response.text
            record(run, response.json(), start, stop)
            run.forecasts[stop] = forecast(client)
        run.stream = stream_view(client)
    return run


def assert_resends_are_idempotent(
    client: httpx.Client, series: Series, start: int, stop: int
) -> None:
    """An exact re-send is all duplicates; a changed or older reading is refused; nothing moves."""
    before = stream_view(client)
    again = post(client, series, start, stop)
    assert again.status_code == 200, again.text
    assert again.json() == {
        "accepted": 0,
        "duplicates": stop - start,
        "results": [],
        "opened": [],
        "closed": [],
    }
    changed = payload(series, start, stop)
    changed["readings"][-1]["value"] += 0.5
    refused = client.post(f"/v1/streams/{STREAM}/readings", json=changed)
    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "cannot change" in refused.json()["detail"]
    older = payload(series, stop - 1, stop)
    older["readings"][0]["t"] = (at(stop - 1) - timedelta(milliseconds=50)).isoformat()
    refused = client.post(f"/v1/streams/{STREAM}/readings", json=older)
    assert refused.status_code == 409, refused.text
    assert "older than" in refused.json()["detail"]
    assert stream_view(client) == before


@contextmanager
def transaction_blocker(
    backend: str, database_url: str, *, stream: str = STREAM
) -> Iterator[Callable[[], None]]:
    """Hold a lock the next ingest's transaction needs; yield a wait until it is stuck on it.

    SQLite: the database's write lock, so the ingest processes its batch and then waits at its
    first write. PostgreSQL: the stream's row, which the ingest locks first (it is the lock
    between processes), so it waits inside its transaction.
    """
    if backend == "sqlite":
        path = make_url(database_url).database
        assert path is not None
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Nothing observable tells that the server waits; whether it waits yet or not, it
            # cannot commit while we hold the lock, so the outcome does not depend on the wait.
            yield lambda: time.sleep(SQLITE_GRACE_S)
        finally:
            connection.execute("ROLLBACK")
            connection.close()
        return

    engine = create_engine(database_url)
    try:
        with engine.connect() as holder:
            holder.execute(
                text("SELECT id FROM streams WHERE id = :s FOR UPDATE"),
                {"s": stream},
            )
            me = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()

            def wait_until_blocked() -> None:
                deadline = time.monotonic() + 30
                with engine.connect() as probe:
                    while True:
                        blocked = probe.execute(
                            text(
                                "SELECT count(*) FROM pg_stat_activity "
                                "WHERE :me = ANY(pg_blocking_pids(pid))"
                            ),
                            {"me": me},
                        ).scalar_one()
                        probe.rollback()  # a fresh snapshot of pg_stat_activity each time
                        if blocked:
                            return
                        assert time.monotonic() < deadline, "the ingest never reached the lock"
                        time.sleep(0.02)

            yield wait_until_blocked
            holder.rollback()
    finally:
        engine.dispose()


def kill_in_flight(
    server: ServeProcess, backend: str, database_url: str, body: dict[str, Any]
) -> None:
    """Send `body` and SIGKILL the server while the batch's transaction cannot commit."""
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["response"] = httpx.post(
                f"{server.base_url}/v1/streams/{STREAM}/readings", json=body, timeout=60.0
            )
        except httpx.TransportError as exc:
            outcome["error"] = exc

    with transaction_blocker(backend, database_url) as wait_until_blocked:
        sender = threading.Thread(target=send)
        sender.start()
        wait_until_blocked()
        server.kill()
        sender.join(timeout=60)
    assert not sender.is_alive()
    assert "response" not in outcome, f"answered although it could not commit: {outcome}"


def stream_with_kills(
    server: ServeProcess, series: Series, backend: str, database_url: str
) -> tuple[Run, dict[str, int]]:
    """Stream the batches, killing and restarting the server at the two points."""
    run = Run()
    seen = {"restarts": 0}
    client = client_for(server)
    create_stream(client)
    resend_from: int | None = None  # a retrying client re-sends from here with the next batch
    previous_start = BATCHES[0][0]
    for start, stop in BATCHES:
        if (start, stop) == KILL_IN_FLIGHT:
            before = stream_view(client)
            client.close()
            kill_in_flight(server, backend, database_url, payload(series, start, stop))
            server.start()
            seen["restarts"] += 1
            client = client_for(server)
            # All or nothing: the killed transaction left no trace.
            assert stream_view(client) == before
            assert forecast(client) == pytest.approx(run.forecasts[start], abs=TOLERANCE)
            resend_from = previous_start  # the client re-sends its last acknowledged batch too
        first = start if resend_from is None else resend_from
        response = post(client, series, first, stop)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["duplicates"] == start - first  # the re-sent readings, not re-processed
        record(run, answer, first, stop)
        run.forecasts[stop] = forecast(client)
        resend_from = None
        previous_start = start
        if (start, stop) == KILL_AFTER_ANSWER:
            before = stream_view(client)
            client.close()
            server.kill()
            server.start()
            seen["restarts"] += 1
            client = client_for(server)
            after = stream_view(client)
            assert after == before  # the checkpoint restored the state exactly
            assert forecast(client) == pytest.approx(run.forecasts[stop], abs=TOLERANCE)
            assert_resends_are_idempotent(client, series, start, stop)
            resend_from = start  # as if the 2xx had been lost: re-send with the next batch
    run.stream = stream_view(client)
    client.close()
    return run, seen


def assert_same(actual: Any, expected: Any, where: str) -> None:
    """Equal JSON-like values (numbers within TOLERANCE: none)."""
    if isinstance(expected, float) and isinstance(actual, float | int):
        assert math.isclose(actual, expected, rel_tol=0, abs_tol=TOLERANCE), (
            f"{where}: {actual!r} != {expected!r}"
        )
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


ALARM_FIELDS = (
    "stream_id",
    "detector",
    "state",
    "opened_at",
    "opened_sample",
    "closed_at",
    "closed_sample",
    "peak",
    "threshold",
    "model_name",
    "model_version",
    "acknowledged_at",
)


def alarm_rows(database_url: str) -> list[dict[str, Any]]:
    """The alarms table as stored (ids aside: a rolled-back insert may consume a sequence value)."""
    database = Database(database_url)
    try:
        with database.session() as session:
            alarms = session.scalars(
                select(Alarm).order_by(Alarm.opened_sample, Alarm.detector, Alarm.stream_id)
            )
            return [{name: getattr(alarm, name) for name in ALARM_FIELDS} for alarm in alarms]
    finally:
        database.dispose()


def without_wall_clock(view: dict[str, Any]) -> dict[str, Any]:
    """A stream view minus what depends on when the run happened (and alarm ids)."""
    view = {k: v for k, v in view.items() if k not in ("created_at", "updated_at")}
    view["open_alarms"] = [
        {k: v for k, v in alarm.items() if k != "id"} for alarm in view["open_alarms"]
    ]
    return view


@pytest.mark.parametrize("backend", E2E_BACKENDS)
def test_sigkilled_server_continues_exactly_like_an_uninterrupted_one(
    backend: str,
    make_server: ServerFactory,
    databases: ExitStack,
    seed0_lab: Series,
    tmp_path: Path,
) -> None:
    reference_url = new_database(databases, backend, tmp_path)
    subject_url = new_database(databases, backend, tmp_path)
    reference = make_server("reference", reference_url)
    subject = make_server("subject", subject_url)
    reference.launch()  # both import torch and load the model side by side
    subject.launch()
    reference.wait_ready()
    subject.wait_ready()

    expected = stream_reference(reference, seed0_lab)
    reference.stop()
    actual, seen = stream_with_kills(subject, seed0_lab, backend, subject_url)
    subject.stop()

    assert seen["restarts"] == 2
    samples = list(range(FIRST_SAMPLE, END_SAMPLE))
    assert sorted(expected.results) == samples
    assert sorted(actual.results) == samples  # every reading processed exactly once
    for sample in samples:
        assert_same(actual.results[sample], expected.results[sample], f"result {sample}")
    assert_same(actual.forecasts, expected.forecasts, "forecasts")
    assert actual.stream["samples_seen"] == END_SAMPLE - FIRST_SAMPLE
    assert_same(without_wall_clock(actual.stream), without_wall_clock(expected.stream), "stream")

    expected_alarms = alarm_rows(reference_url)
    actual_alarms = alarm_rows(subject_url)
    assert len(actual_alarms) == len(expected_alarms)
    for index, (got, want) in enumerate(zip(actual_alarms, expected_alarms, strict=True)):
        assert_same(got, want, f"alarm {index}")
    # The scenario is only a test if alarms were open across both kills.
    for kill_sample in (KILL_AFTER_ANSWER[1] - FIRST_SAMPLE, KILL_IN_FLIGHT[0] - FIRST_SAMPLE):
        assert any(
            row["opened_sample"] < kill_sample
            and (row["closed_sample"] is None or row["closed_sample"] > kill_sample)
            for row in expected_alarms
        ), f"no alarm open across the kill at sample {kill_sample}"
