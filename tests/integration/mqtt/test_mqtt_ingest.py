"""Readings published over MQTT, against a real Mosquitto of the test's own: plain JSON in the
service's reading formats and Sparkplug B; the same lab record through MQTT and HTTP gives
the same alarm rows; a message the service cannot take is acknowledged, counted by cause and
never stops the others; a message delivered again is not a second reading; a Sparkplug node's
death makes its streams stale.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.forecasting.artifacts import load_model
from app.mqtt import sparkplug
from app.storage.db import Database
from app.storage.models import Alarm
from app.storage.repositories import readings as reading_repo
from app.twin.mqtt import MqttPublisher
from tests.integration.conftest import AppFactory
from tests.integration.test_twin_client import send, spiky
from tests.support.models import epoch_times, lab_readings
from tests.support.mosquitto import Mosquitto, Publisher, mosquitto
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(240)

SHIPPED = "lstm-stateful-day-seed3"
START, STOP, BATCH = 6000, 8000, 100
READINGS = 150  # a Sparkplug device's, past its learning


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with mosquitto(tmp_path / "broker") as running:
        yield running


@pytest.fixture
def publisher(broker: Mosquitto) -> Iterator[Publisher]:
    sender = Publisher(broker, client_id=f"publisher-{uuid.uuid4().hex[:6]}")
    yield sender
    sender.close()


def _service(make_client: AppFactory, broker: Mosquitto, **settings: Any) -> TestClient:
    """The service subscribed to the broker (what is published before is not delivered)."""
    client = make_client(
        **{
            "mqtt_url": broker.url,
            "mqtt_client_id": f"twinwatch-{uuid.uuid4().hex[:6]}",
            "mqtt_topics": ["plant/#", "spBv1.0/#"],
            **settings,
        }
    )
    until(lambda: _gauge(client, "twinwatch_mqtt_subscribed") == 1, "not subscribed", 30)
    return client


def _gauge(client: TestClient, name: str) -> float | None:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(family.samples[0].value)
    return None


def _outcomes(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "twinwatch_mqtt_messages"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _count(database: Database, stream_id: str) -> int:
    with database.session() as session:
        return reading_repo.count(session, stream_id=stream_id)


def _alarms(database: Database, stream_id: str) -> list[tuple[Any, ...]]:
    with database.session() as session:
        rows = session.scalars(
            select(Alarm).where(Alarm.stream_id == stream_id).order_by(Alarm.id)
        ).all()
        return [
            (a.detector, a.opened_sample, a.closed_sample, a.opened_at, a.closed_at, a.peak)
            for a in rows
        ]


def _open_alarms(client: TestClient, stream_id: str) -> list[str]:
    alarms = client.get(f"/v1/streams/{stream_id}").json()["open_alarms"]
    return [alarm["detector"] for alarm in alarms]


def test_the_lab_record_over_mqtt_raises_the_alarms_it_raises_over_http(
    make_client: AppFactory, broker: Mosquitto, publisher: Publisher, database: Database
) -> None:
    client = _service(make_client, broker, shipped_models=True, artifact_loader=load_model)
    for stream_id in ("over-http", "over-mqtt"):
        assert client.put(f"/v1/streams/{stream_id}", json={"model": SHIPPED}).status_code == 201
    for first in range(START, STOP, BATCH):
        body = lab_readings(first, first + BATCH)
        answer = client.post("/v1/streams/over-http/readings?results=false", json=body)
        assert answer.status_code == 200, answer.text
        publisher.publish("plant/line-1/over-mqtt", json.dumps(body))
    publisher.wait_published()
    until(lambda: _count(database, "over-mqtt") == STOP - START, "the MQTT readings are not in")
    assert _outcomes(client) == {"committed": (STOP - START) / BATCH}
    http, over_mqtt = _alarms(database, "over-http"), _alarms(database, "over-mqtt")
    assert len(http) >= 3  # the lab's faults
    assert over_mqtt == http


def test_every_plain_format_and_every_refusal_counted_without_stopping_the_rest(
    make_client: AppFactory, broker: Mosquitto, publisher: Publisher, database: Database
) -> None:
    client = _service(make_client, broker, max_body_bytes=4096)
    for stream_id in ("pump-1", "pump-2"):
        assert client.put(f"/v1/streams/{stream_id}", json={}).status_code == 201
    t = epoch_times(0, 10)
    publisher.publish("plant/pump-1", json.dumps({"t": t[0], "value": 1.0}))  # one reading
    publisher.publish("plant/pump-1", json.dumps({"readings": [{"t": t[1], "value": 1.1}]}))
    many = {
        "streams": [
            {"stream": s, "readings": [{"t": t[2], "value": 2.0}]} for s in ("pump-1", "pump-2")
        ]
    }
    publisher.publish("plant/gateway", json.dumps(many))  # the topic names no stream here
    publisher.publish("plant/pump-1", b"{not json")
    publisher.publish("plant/pump-1", json.dumps({"t": t[3], "value": "1.2"}))  # a string
    publisher.publish("plant/pump-1", json.dumps({"readings": [{"t": t[4], "value": 0.0}] * 200}))
    publisher.publish("plant/nobody", json.dumps({"t": t[3], "value": 1.0}))  # not configured
    publisher.publish("plant/pump-1", json.dumps({"t": t[0] - 100, "value": 1.0}))  # older
    publisher.publish("plant/pump-1", json.dumps({"t": t[1], "value": 1.1}))  # sent again
    publisher.publish("plant/pump-1", json.dumps({"t": t[5], "value": 1.3}))
    publisher.wait_published()
    expected = {
        "committed": 5,  # the three formats, the reading sent again, the last one
        "malformed": 2,
        "too_large": 1,
        "unknown_stream": 1,
        "conflict": 1,  # older than the last accepted
    }
    until(lambda: sum(_outcomes(client).values()) == 10, "not every message was taken")
    assert _outcomes(client) == expected
    assert _count(database, "pump-1") == 4  # t0, t1, t2, t5: the one sent again once
    assert _count(database, "pump-2") == 1


def test_a_sparkplug_node_s_births_name_its_data_and_its_death_makes_its_streams_stale(
    make_client: AppFactory, broker: Mosquitto, publisher: Publisher, database: Database
) -> None:
    client = _service(make_client, broker, stale_periods=10, stale_min_s=3600)
    stream_id = "plant.edge-1.pump-7"
    config = {"model": "auto", "channels": ["flow", "Motor.temp"], "learning": {"readings": 100}}
    assert client.put(f"/v1/streams/{stream_id}", json=config).status_code == 201
    commands: list[bytes] = []
    listener = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="listener")
    listener.on_message = lambda _c, _u, message: commands.append(bytes(message.payload))
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe("spBv1.0/plant/NCMD/edge-1", qos=1)
    listener.loop_start()
    try:
        t0 = int(epoch_times(0, 1)[0] * 1000)
        metrics = {"flow": 1.0, "Motor/temp": 40.0}
        # Data before any birth (the service came after it): refused, the node asked again.
        publisher.publish("spBv1.0/plant/DDATA/edge-1/pump-7", sparkplug.encode(t0, metrics))
        until(lambda: commands, "no rebirth command")
        rebirth = sparkplug.Payload.FromString(commands[0])
        assert rebirth.metrics[0].name == "Node Control/Rebirth"
        assert rebirth.metrics[0].boolean_value is True
        publisher.publish("spBv1.0/plant/NBIRTH/edge-1", sparkplug.encode(t0, {}, birth=True))
        publisher.publish(
            "spBv1.0/plant/DBIRTH/edge-1/pump-7", sparkplug.encode(t0, metrics, birth=True)
        )
        for i in range(1, READINGS):  # by alias, as Sparkplug data goes
            values = {"flow": 1.0 + 0.01 * i, "Motor/temp": 40.0 + 0.1 * i}
            publisher.publish(
                "spBv1.0/plant/DDATA/edge-1/pump-7", sparkplug.encode(t0 + 100 * i, values, seq=i)
            )
        publisher.wait_published()
        until(lambda: _count(database, stream_id) == READINGS, "the Sparkplug readings are not in")
        history = client.get(f"/v1/streams/{stream_id}/readings").json()
        assert history["value"][-1] == pytest.approx(1.0 + 0.01 * (READINGS - 1))  # flow
        outcomes = _outcomes(client)
        assert outcomes["no_birth"] == 1
        assert outcomes["committed"] == READINGS  # the device's birth is a reading too
        assert client.get(f"/v1/streams/{stream_id}").json()["open_alarms"] == []
        # Data and the node's death back to back: the death in its turn, after the data.
        last = {"flow": 1.0 + 0.01 * READINGS, "Motor/temp": 40.0 + 0.1 * READINGS}
        publisher.publish(
            "spBv1.0/plant/DDATA/edge-1/pump-7", sparkplug.encode(t0 + 100 * READINGS, last)
        )
        publisher.publish("spBv1.0/plant/NDEATH/edge-1", sparkplug.Payload().SerializeToString())
        publisher.wait_published()
        until(lambda: _outcomes(client).get("death") == 1, "the death was not taken")
        assert _count(database, stream_id) == READINGS + 1
        assert "stale" in _open_alarms(client, stream_id)
    finally:
        listener.loop_stop()
        listener.disconnect()


def test_a_sparkplug_birth_of_an_unknown_device_makes_its_stream(
    make_client: AppFactory, broker: Mosquitto, publisher: Publisher, database: Database
) -> None:
    """A device's birth makes the stream it names, learning, with its numeric metrics as
    channels; its data follows. Metrics past what a stream takes are refused, once, and the
    service goes on."""
    client = _service(make_client, broker)
    t0 = int(epoch_times(0, 1)[0] * 1000)
    metrics = {"flow": 1.0, "Motor/temp": 40.0}
    publisher.publish(
        "spBv1.0/plant/DBIRTH/edge-2/pump-9", sparkplug.encode(t0, metrics, birth=True)
    )
    for i in range(1, 20):
        values = {"flow": 1.0 + 0.01 * i, "Motor/temp": 40.0 + 0.1 * i}
        publisher.publish(
            "spBv1.0/plant/DDATA/edge-2/pump-9", sparkplug.encode(t0 + 100 * i, values, seq=i)
        )
    too_many = {f"m{i}": float(i) for i in range(200)}
    publisher.publish(
        "spBv1.0/plant/DBIRTH/edge-2/wide", sparkplug.encode(t0, too_many, birth=True)
    )
    publisher.wait_published()
    until(lambda: _count(database, "plant.edge-2.pump-9") == 20, "the device's readings")
    until(lambda: _outcomes(client).get("refused") == 1, "the wide device was not refused")
    made = client.get("/v1/streams/plant.edge-2.pump-9").json()
    assert (made["model"], made["channels"], made["phase"]) == (
        "auto",
        ["flow", "Motor.temp"],
        "learning",
    )
    assert client.get("/v1/streams/plant.edge-2.wide").status_code == 404


def test_with_stream_making_off_a_birth_of_an_unknown_device_is_refused(
    make_client: AppFactory, broker: Mosquitto, publisher: Publisher
) -> None:
    client = _service(make_client, broker, mqtt_create_streams=False)
    t0 = int(epoch_times(0, 1)[0] * 1000)
    birth = sparkplug.encode(t0, {"flow": 1.0}, birth=True)
    publisher.publish("spBv1.0/plant/DBIRTH/edge-3/pump-1", birth)
    publisher.wait_published()
    until(lambda: _outcomes(client).get("unknown_stream") == 1, "the birth was not refused")
    assert client.get("/v1/streams/plant.edge-3.pump-1").status_code == 404


def test_the_twin_publishes_over_mqtt_and_its_spike_is_an_alarm(
    make_client: AppFactory, broker: Mosquitto, database: Database
) -> None:
    """`twinwatch twin --mqtt`: the stream registered over HTTP, the readings through the
    broker, the alarm raised by the subscribed service."""
    client = _service(make_client, broker, mqtt_topics=["twinwatch/#"])
    scenario = spiky()
    publisher = MqttPublisher("http://testserver", broker.url, http=client)  # type: ignore[arg-type]
    with publisher:
        report = send(client, "twin-1", scenario, service=publisher)
    assert report.sent == scenario.samples
    until(lambda: _count(database, "twin-1") == scenario.samples, "the twin's readings")
    alarms = client.get("/v1/alarms", params={"stream": "twin-1"}).json()["items"]
    assert any(alarm["detector"] == "point" for alarm in alarms)
