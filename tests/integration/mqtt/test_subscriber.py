"""The MQTT subscriber against a real Mosquitto, with a commit of the test's own: a message is
acknowledged to the broker only once its readings are committed, so what a stopped (or
crashed) service held comes again to the next; a commit that fails for no foreseen reason is
tried again and nothing behind it overtakes it."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from app.errors import UnavailableError
from app.mqtt.payloads import Items
from app.mqtt.subscriber import MqttIngest
from tests.support.mosquitto import Mosquitto, Publisher, mosquitto
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with mosquitto(tmp_path / "broker") as running:
        yield running


class Committed:
    """What the commits took, in order; `fail` decides, per attempt, whether one raises."""

    def __init__(self, fail: type[Exception] | None = None, times: int = 0) -> None:
        self.taken: list[float] = []
        self.attempts = 0
        self.fail, self.times = fail, times
        self.lock = threading.Lock()

    def __call__(self, items: Items, _count_refused: bool) -> None:
        with self.lock:
            self.attempts += 1
            if self.fail is not None and self.attempts <= self.times:
                raise self.fail("not now")
            for _, readings in items:
                self.taken.extend(reading.t.timestamp() for reading in readings)


def subscriber(broker: Mosquitto, client_id: str, commit: Committed) -> MqttIngest:
    ingest = MqttIngest(
        broker.url,
        ["plant/#"],
        commit,
        client_id=client_id,
        max_bytes=1 << 20,
        max_batch=10_000,
        registry=CollectorRegistry(),
    )
    ingest.start()
    until(lambda: ingest.subscribed._value.get() == 1, "not subscribed", 30)
    return ingest


def publish(publisher: Publisher, first: int, count: int) -> list[float]:
    times = [1.7e9 + i for i in range(first, first + count)]
    for t in times:
        publisher.publish("plant/pump-1", json.dumps({"t": t, "value": 1.0}))
    publisher.wait_published()
    return times


def test_what_a_stopped_subscriber_had_not_committed_comes_to_the_next(
    broker: Mosquitto,
) -> None:
    client_id = f"twinwatch-{uuid.uuid4().hex[:6]}"
    publisher = Publisher(broker, client_id="publisher")
    try:
        away = Committed(fail=UnavailableError, times=10**9)  # the database away throughout
        first = subscriber(broker, client_id, away)
        sent = publish(publisher, 0, 5)
        until(lambda: away.attempts >= 1, "nothing was tried")
        first.stop()  # with all five in hand, none committed: none acknowledged
        assert away.taken == []
        back = Committed()
        second = subscriber(broker, client_id, back)
        try:
            sent += publish(publisher, 5, 5)
            until(lambda: len(back.taken) == len(sent), f"{len(back.taken)} taken", 30)
            assert back.taken == sent  # the five held before, then the five after, in order
        finally:
            second.stop()
    finally:
        publisher.close()


def test_a_commit_that_fails_unforeseen_is_tried_again_and_nothing_overtakes_it(
    broker: Mosquitto,
) -> None:
    publisher = Publisher(broker, client_id="publisher")
    flaky = Committed(fail=RuntimeError, times=3)
    ingest = subscriber(broker, f"twinwatch-{uuid.uuid4().hex[:6]}", flaky)
    try:
        sent = publish(publisher, 0, 20)
        until(lambda: len(flaky.taken) == len(sent), f"{len(flaky.taken)} taken")
        assert flaky.taken == sent
        assert flaky.attempts > 3
    finally:
        ingest.stop()
        publisher.close()
