"""The twin publishing its readings over MQTT (`twinwatch twin --mqtt`), as a plant's gateway
would: each batch a QoS 1 message `{"readings": [...]}` on `<prefix>/<stream>`, which a service
subscribed to the broker takes (README: Readings over MQTT). The stream is still registered,
and the alarms listed, over HTTP."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from app.errors import AppError
from app.twin.client import ServiceClient, TransientError

PUBLISH_TIMEOUT_S = 10.0


class MqttPublisher(ServiceClient):
    """A service client whose readings go to the broker; `post_readings` returns once the
    broker has them (PUBACK), with no alarms: the service answers nothing over MQTT."""

    def __init__(
        self,
        url: str,
        broker_url: str,
        *,
        prefix: str = "twinwatch",
        token: str | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        super().__init__(url, token=token, http=http)
        parts = urlsplit(broker_url)
        if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
            raise AppError(f"--mqtt {broker_url!r}: give mqtt://host:1883")
        self.prefix = prefix.rstrip("/")
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"twinwatch-twin-{uuid.uuid4().hex[:8]}"
        )
        if parts.username:
            self.client.username_pw_set(unquote(parts.username), unquote(parts.password or ""))
        try:
            self.client.connect(parts.hostname, parts.port or 1883)
        except OSError as exc:
            raise AppError(f"cannot reach the MQTT broker {broker_url}: {exc}") from None
        self.client.loop_start()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        super().close()

    def post_readings(self, stream_id: str, readings: list[dict[str, Any]]) -> dict[str, Any]:
        message = self.client.publish(
            f"{self.prefix}/{stream_id}", json.dumps({"readings": readings}), qos=1
        )
        try:
            message.wait_for_publish(PUBLISH_TIMEOUT_S)
        except RuntimeError as exc:  # not connected: paho reconnects meanwhile
            raise TransientError(f"MQTT: {exc}") from None
        if not message.is_published():
            raise TransientError(f"MQTT: the broker did not take it in {PUBLISH_TIMEOUT_S:g} s")
        return {"accepted": len(readings), "duplicates": 0, "opened": [], "closed": []}
