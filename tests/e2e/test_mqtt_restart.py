"""Readings over MQTT, through real processes and a real Mosquitto:

- they survive a SIGKILL of the service and a restart of the broker: `twinwatch serve` takes
  the lab record (faults and all) from a publisher that keeps sending through both; it is
  killed mid-stream while its commit waits on a lock the test holds (messages in hand,
  unacknowledged), and restarted, and later the broker is stopped and
  started again. Every reading is taken once: the stored readings and the alarm rows are those
  of a server that took the same record over HTTP without interruption;
- on the bus, `serve` puts them on their partitions and a `twinwatch worker` commits them: the
  same alarm rows again."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import E2E_BACKENDS, ServeProcess, ServerFactory, new_database
from tests.e2e.test_restart import alarm_rows, transaction_blocker
from tests.support.bus import PARTITIONS, WorkerProcess, until_held, worker_env
from tests.support.models import lab_readings
from tests.support.mosquitto import Mosquitto, Publisher, mosquitto
from tests.support.nats import nats_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STREAM = "mount-1"
START, STOP, PER_MESSAGE = 6000, 8000, 10
BLOCKED_AT, KILLED_AT, RESTARTED_AT, BROKER_RESTARTED_AT = 55, 60, 90, 140  # messages sent
PACE_S = 0.01  # between messages: the kill and the broker's restart come mid-stream


def _subscribed(server: ServeProcess, broker: Mosquitto) -> None:
    server.env |= {
        "TWINWATCH_MQTT_URL": broker.url,
        "TWINWATCH_MQTT_TOPICS": '["plant/#"]',
        "TWINWATCH_MQTT_CLIENT_ID": f"twinwatch-{server.name}",
    }


def _until_subscribed(server: ServeProcess) -> None:
    deadline = time.monotonic() + 30
    while "twinwatch_mqtt_subscribed 1.0" not in httpx.get(f"{server.base_url}/metrics").text:
        assert time.monotonic() < deadline, f"{server.name} did not subscribe"
        time.sleep(0.05)


def _configured(*servers: ServeProcess) -> None:
    for server in servers:
        made = httpx.put(f"{server.base_url}/v1/streams/{STREAM}", json={}, timeout=30)
        assert made.status_code == 201, made.text


def _all_stored(database_url: str) -> None:
    deadline = time.monotonic() + 120
    while _stored(database_url) < STOP - START:
        assert time.monotonic() < deadline, f"{_stored(database_url)} readings stored"
        time.sleep(0.2)
    time.sleep(1.0)  # anything delivered twice has come by now
    assert _stored(database_url) == STOP - START


def _stored(database_url: str) -> int:
    from app.storage.db import Database
    from app.storage.repositories import readings as reading_repo

    database = Database(database_url)
    try:
        with database.session() as session:
            return reading_repo.count(session, stream_id=STREAM)
    finally:
        database.dispose()


@pytest.mark.parametrize("backend", E2E_BACKENDS)
def test_nothing_is_lost_or_doubled_across_a_kill_and_a_broker_restart(
    backend: str, make_server: ServerFactory, databases: ExitStack, tmp_path: Path
) -> None:
    with mosquitto(tmp_path / "broker") as broker:
        reference_url = new_database(databases, backend, tmp_path / "reference")
        subject_url = new_database(databases, backend, tmp_path / "subject")
        reference = make_server("reference", reference_url)
        subject = make_server("subject", subject_url)
        _subscribed(subject, broker)
        reference.launch()
        subject.launch()
        reference.wait_ready()
        subject.wait_ready()
        _until_subscribed(subject)
        _configured(reference, subject)
        publisher = Publisher(broker)
        blocked = ExitStack()
        try:
            with blocked, httpx.Client(base_url=reference.base_url, timeout=60) as client:
                for sent, first in enumerate(range(START, STOP, PER_MESSAGE)):
                    body = lab_readings(first, first + PER_MESSAGE)
                    answer = client.post(f"/v1/streams/{STREAM}/readings", json=body)
                    assert answer.status_code == 200, answer.text
                    publisher.publish(f"plant/line-1/{STREAM}", json.dumps(body))
                    time.sleep(PACE_S)
                    if sent == BLOCKED_AT:  # its next commit waits on a lock the test holds
                        stuck = blocked.enter_context(
                            transaction_blocker(backend, subject_url, stream=STREAM)
                        )
                    elif sent == KILLED_AT:  # messages in hand, unacknowledged
                        stuck()
                        subject.kill()
                        blocked.close()
                    elif sent == RESTARTED_AT:
                        subject.start()
                    elif sent == BROKER_RESTARTED_AT:
                        broker.stop()
                        broker.start()
            publisher.wait_published()
            _all_stored(subject_url)
        finally:
            publisher.close()
        expected = alarm_rows(reference_url)
        assert len(expected) >= 3  # the lab's faults
        assert alarm_rows(subject_url) == expected
        assert subject.starts == 2


def test_on_the_bus_mqtt_readings_are_committed_by_a_worker_with_the_same_alarms(
    make_server: ServerFactory, databases: ExitStack, tmp_path: Path, calibrated_models: Path
) -> None:
    reference_url = new_database(databases, "postgresql", tmp_path / "reference")
    bus_url = new_database(databases, "postgresql", tmp_path / "bus")
    with (
        mosquitto(tmp_path / "broker") as broker,
        nats_server(tmp_path / "nats") as nats,
    ):
        env = worker_env(bus_url, nats.url, calibrated_models, tmp_path / "worker-data")
        reference = make_server("reference", reference_url)
        api = make_server("on-the-bus", bus_url)
        api.env |= {key: env[key] for key in env if key.startswith("TWINWATCH_BUS_")}
        _subscribed(api, broker)
        reference.launch()
        api.launch()
        reference.wait_ready()
        api.wait_ready()  # (it migrates the database: the worker starts on it after)
        _until_subscribed(api)
        worker = WorkerProcess("worker", env, tmp_path)
        try:
            asyncio.run(until_held(nats.url, lambda held: len(held) == PARTITIONS, 90))
            _configured(reference, api)
            publisher = Publisher(broker)
            try:
                with httpx.Client(base_url=reference.base_url, timeout=60) as client:
                    for first in range(START, STOP, PER_MESSAGE):
                        body = lab_readings(first, first + PER_MESSAGE)
                        answer = client.post(f"/v1/streams/{STREAM}/readings", json=body)
                        assert answer.status_code == 200, answer.text
                        publisher.publish(f"plant/{STREAM}", json.dumps(body))
                publisher.wait_published()
                _all_stored(bus_url)
            finally:
                publisher.close()
        finally:
            worker.end(signal.SIGKILL)
    expected = alarm_rows(reference_url)
    assert len(expected) >= 3
    assert alarm_rows(bus_url) == expected
