"""An MQTT broker of a test's own: Debian's `mosquitto` on a free loopback port, its
persistence in a directory of the test (a restart keeps the sessions and their queued
messages); stopped, killed or restarted by the test. And a publisher that keeps its session,
as a gateway does."""

from __future__ import annotations

import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.nats import LocalServer, free_port, running

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
)


class Mosquitto(LocalServer):
    def __init__(self, directory: Path) -> None:
        if MOSQUITTO is None:
            pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
        self.directory = directory
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.config = directory / "mosquitto.conf"
        (directory / "store").mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            # As root, it would switch to the user `mosquitto`, who cannot write the test's
            # directory: it stays who started it (as any other user, this has no effect).
            "user root\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {directory / 'store'}/\n"
            "autosave_interval 1\n"
            # What a service away for a while must find on its return: every message.
            "max_queued_messages 0\n"
            "max_inflight_messages 100\n"
        )

    def command(self) -> list[str]:
        assert MOSQUITTO is not None
        return [MOSQUITTO, "-c", str(self.config)]


def mosquitto(directory: Path) -> AbstractContextManager[Mosquitto]:
    return running(Mosquitto(directory))


class Publisher:
    """A paho client in its own network thread, QoS 1 in a kept session: what it published
    reaches the broker across the broker's restarts."""

    def __init__(self, broker: Mosquitto, client_id: str = "test-publisher") -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self.client.max_queued_messages_set(0)
        self.client.max_inflight_messages_set(100)
        self.client.reconnect_delay_set(min_delay=1, max_delay=2)
        self.sent = 0
        self.acknowledged = 0  # PUBACKs (paho sends again, on reconnecting, what had none)
        self.client.on_publish = self._acknowledged
        self.client.connect(host="127.0.0.1", port=broker.port)
        self.client.loop_start()

    def _acknowledged(self, *_args: object) -> None:
        self.acknowledged += 1

    def publish(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos=qos)
        self.sent += 1

    def wait_published(self, timeout_s: float = 60.0) -> None:
        """Until the broker has acknowledged everything sent (what was sent while it was away
        too: paho sends it again once it is back)."""
        deadline = time.monotonic() + timeout_s
        while self.acknowledged < self.sent:
            assert time.monotonic() < deadline, "the broker did not take every message in time"
            time.sleep(0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
