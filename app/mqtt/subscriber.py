"""MQTT ingest (`TWINWATCH_MQTT_URL`): the service subscribes to its topic filters and takes each
message's readings (app/mqtt/payloads.py says how a topic and a payload map to them) through
the same ingest as `POST /v1/readings`, or onto the bus's partitions when the service runs on
the bus.

Nothing is lost across a restart: the subscription is QoS 1 in a session the broker keeps
(`clean_session` false under a fixed client id), so the broker holds what arrives while the
service is away; a message is acknowledged (PUBACK) only once its readings are committed (or
stored on the bus), so one in hand when the service dies is delivered again; a message
delivered again is counted in `duplicates`, never taken twice (ingest knows a reading it
stored). A payload the service cannot take (malformed, too large, an unknown stream, readings
older than those stored) is acknowledged and counted by cause
(`twinwatch_mqtt_messages_total`), and each cause logged once, never a crash. While the
database is away nothing is acknowledged: the messages in hand are tried again, in order.

Paho's network thread receives; one thread of this module takes what has arrived, in order,
a transaction for each run of messages whose streams differ, and never skips one: a message
it cannot take now (the database away, or anything unforeseen) is tried again, and the ones
behind it wait. A Sparkplug death marks its streams stale in its turn, after the data before
it. `twinwatch_mqtt_subscribed` is 1 while the subscription holds."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry, Counter, Gauge

from app.errors import AppError, NotFoundError
from app.mqtt import sparkplug
from app.mqtt.payloads import BIRTHS, DEATHS, Items, PayloadError, Sparkplug, plain_json
from app.service.readings import request_size
from app.storage.db import UNAVAILABLE

log = logging.getLogger(__name__)

MOST_MESSAGES = 256  # taken at once from what has arrived
RETRY_S = 1.0  # how long messages the database (or the bus) could not take wait
KEEPALIVE_S = 30
REBIRTH_EVERY_S = 60.0  # a node asked to be born again at most this often

Commit = Callable[[Items, bool], object]
"""Takes a request's readings durably (ingest and commit, or stored on the bus), counting
refused readings if asked (the second argument); raises an AppError for readings refused, one
of UNAVAILABLE (or a 503 AppError) while it cannot."""

Gone = Callable[[Callable[[str], bool]], object]
"""Marks stale now the streams a test picks (a Sparkplug death)."""

Announce = Callable[[Items], object]
"""Creates those of a Sparkplug birth's streams that do not exist yet (their channels: the
metrics its readings name); raises as `Commit` does."""


class _StoppingError(Exception):
    """The service stops while what is in hand cannot be taken: it stays unacknowledged."""


@dataclass
class _Message:
    topic: str | None  # None: not UTF-8
    payload: bytes
    mid: int
    qos: int
    connection: int  # which connection delivered it: an acknowledgement goes back on that one
    items: Items = field(default_factory=list)
    died: sparkplug.Topic | None = None  # a death: its streams stale, in its turn
    born: bool = False  # a Sparkplug birth: its streams announced before its readings
    read: bool = False  # (once: a retried batch does not parse it again)
    refusal: tuple[str, str] | None = None  # why it holds nothing to take: (cause, detail)


class MqttIngest:
    """The subscriber: start() connects (and reconnects, by itself) and takes messages until
    stop(). `gone` marks streams stale (a Sparkplug death), `announce` makes a birth's streams;
    `max_bytes` and `max_batch` bound a message as a request is bounded."""

    def __init__(
        self,
        url: str,
        topics: list[str],
        commit: Commit,
        *,
        client_id: str,
        max_bytes: int,
        max_batch: int,
        registry: CollectorRegistry,
        gone: Gone | None = None,
        announce: Announce | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
            raise ValueError(f"TWINWATCH_MQTT_URL {url!r}: give mqtt://host:1883")
        self.host, self.port = parts.hostname, parts.port or 1883
        self.topics = topics
        self.commit = commit
        self.max_bytes = max_bytes
        self.max_batch = max_batch
        self.gone = gone
        self.announce = announce
        self.sparkplug = Sparkplug()
        self.messages = Counter(
            "twinwatch_mqtt_messages",
            "MQTT messages taken, by outcome: committed, or the cause they were refused for.",
            ["outcome"],
            registry=registry,
        )
        self.subscribed = Gauge(
            "twinwatch_mqtt_subscribed",
            "1 while the service is connected to its MQTT broker and subscribed, else 0.",
            registry=registry,
        )
        self._arrived: queue.Queue[_Message] = queue.Queue()
        # Which connection is current, and whether it is up: an acknowledgement is sent only
        # on the connection that delivered the message (one delivered on an earlier one comes
        # again), checked and sent under the lock both callbacks take.
        self._guard = threading.Lock()
        self._connection = 0
        self._online = False
        self._told: set[str] = set()
        self._rebirths: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=False,
            protocol=mqtt.MQTTv311,
            manual_ack=True,
        )
        self.client.suppress_exceptions = True  # a callback's error never ends the network loop
        if parts.username:
            self.client.username_pw_set(unquote(parts.username), unquote(parts.password or ""))
        self.client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.client.on_connect = self._connected
        self.client.on_disconnect = self._disconnected
        self.client.on_subscribe = self._subscribed
        self.client.on_message = self._received
        self._thread = threading.Thread(target=self._run, name="twinwatch-mqtt", daemon=True)

    def start(self) -> None:
        self.client.connect_async(self.host, self.port, keepalive=KEEPALIVE_S)
        self.client.loop_start()
        self._thread.start()

    def stop(self) -> None:
        """Stop taking messages: those in hand and not committed stay unacknowledged, and the
        broker delivers them again to the next start."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.client.disconnect()
        self.client.loop_stop()

    # -- paho's network thread --

    def _connected(
        self, client: mqtt.Client, _data: object, _flags: object, reason: object, _props: object
    ) -> None:
        if getattr(reason, "is_failure", False):
            log.warning("MQTT: %s:%d refused the connection: %s", self.host, self.port, reason)
            return
        with self._guard:
            self._connection += 1
            self._online = True
        client.subscribe([(topic, 1) for topic in self.topics])

    def _subscribed(
        self,
        _client: mqtt.Client,
        _data: object,
        _mid: int,
        reasons: list[ReasonCode],
        _props: Properties | None,
    ) -> None:
        refused = [
            (topic, reason)
            for topic, reason in zip(self.topics, reasons, strict=False)
            if reason.is_failure
        ]
        if refused:
            log.error("MQTT: the broker refused the subscription to %s", refused)
            return
        self.subscribed.set(1)
        log.info("MQTT: subscribed to %s on %s:%d", ", ".join(self.topics), self.host, self.port)

    def _disconnected(self, *_args: object) -> None:
        with self._guard:
            self._connection += 1
            self._online = False
        self.subscribed.set(0)
        if not self._stop.is_set():
            log.warning("MQTT: lost the broker %s:%d; reconnecting", self.host, self.port)

    def _received(self, _client: mqtt.Client, _data: object, message: mqtt.MQTTMessage) -> None:
        try:
            topic: str | None = message.topic
        except UnicodeDecodeError:
            topic = None
        with self._guard:
            connection = self._connection
        self._arrived.put(
            _Message(topic, bytes(message.payload), message.mid, message.qos, connection)
        )

    # -- the taking thread --

    def _run(self) -> None:
        batch: list[_Message] = []
        failures = 0
        while not self._stop.is_set():
            if not batch:
                batch = self._next()
                continue
            try:
                self._take(batch)  # (empties it, message by message, as they are acknowledged)
                failures = 0
            except _StoppingError:
                return
            except Exception:  # never a skipped message: the batch is tried again
                failures += 1
                if failures == 1:
                    log.exception("MQTT: taking a message failed; trying it again")
                self._stop.wait(RETRY_S)

    def _next(self) -> list[_Message]:
        try:
            batch = [self._arrived.get(timeout=0.2)]
        except queue.Empty:
            return []
        while len(batch) < MOST_MESSAGES:
            try:
                batch.append(self._arrived.get_nowait())
            except queue.Empty:
                break
        return batch

    def _take(self, batch: list[_Message]) -> None:
        """Take the batch's messages in order: runs of messages of distinct streams committed
        together; each message acknowledged, and removed from `batch`, once its readings are
        committed, its death applied, or it is refused."""
        while batch:
            run: list[_Message] = []
            streams: set[str] = set()
            size = 0
            for message in batch:
                self._read(message)
                mine = {stream_id for stream_id, _ in message.items}
                count = request_size(message.items)
                alone = message.refusal is not None or message.died is not None or message.born
                if run and (alone or not streams.isdisjoint(mine) or size + count > self.max_batch):
                    break
                run.append(message)
                if alone:
                    break
                streams |= mine
                size += count
            if len(run) == 1 and run[0].refusal is not None:
                self._refused(run[0], *run[0].refusal)
            elif len(run) == 1 and run[0].died is not None:
                self._died(run[0])
            elif len(run) == 1 and run[0].born and not self._announced(run[0]):
                pass  # (refused: the stream could not be made)
            else:
                self._commit_run(run)
            del batch[: len(run)]

    def _read(self, message: _Message) -> None:
        """The message's readings in `message.items` (a death in `message.died`); else, in
        `message.refusal`, why it holds none the service can take."""
        if not message.read:
            message.read = True
            message.refusal = self._readings(message)

    def _readings(self, message: _Message) -> tuple[str, str] | None:
        topic = None
        try:
            if message.topic is None:
                raise PayloadError("its topic is not UTF-8", "malformed")
            if len(message.payload) > self.max_bytes:
                raise PayloadError(
                    f"{len(message.payload)} bytes; at most {self.max_bytes}", "too_large"
                )
            topic = sparkplug.Topic.parse(message.topic)
            if topic is None and message.topic.startswith(f"{sparkplug.NAMESPACE}/"):
                return "no_readings", "a Sparkplug host's state, not a node's"
            if topic is None:
                message.items = plain_json(message.topic, message.payload)
            elif topic.kind in DEATHS:
                message.died = topic
                return None
            else:
                message.items = self.sparkplug.read(topic, message.payload)
                message.born = topic.kind in BIRTHS
        except PayloadError as exc:
            if exc.reason == "no_birth" and topic is not None:
                self._ask_rebirth(topic)
            return exc.reason, exc.detail
        if not message.items:
            return "no_readings", "no readings in it (a command, no numbers)"
        return None

    def _commit_run(self, run: list[_Message]) -> None:
        """Commit a run of messages in one transaction (one by one if one is refused)."""
        items = [item for message in run for item in message.items]
        error = self._until_done(lambda: self.commit(items, len(run) == 1))
        if error is None:
            for message in run:
                self._acknowledge(message, "committed")
        elif len(run) > 1:
            for message in run:
                self._commit_run([message])
        else:
            reason = error.extra.get("reason")
            if not isinstance(reason, str):
                reason = "unknown_stream" if isinstance(error, NotFoundError) else "refused"
            self._refused(run[0], reason, error.detail)

    def _announced(self, message: _Message) -> bool:
        """The birth's streams made if they are missing (`announce`); False if refused."""
        announce = self.announce
        if announce is None:
            return True
        error = self._until_done(lambda: announce(message.items))
        if error is not None:
            self._refused(message, "refused", error.detail)
        return error is None

    def _died(self, message: _Message) -> None:
        assert message.died is not None
        gone, matching = self.gone, self.sparkplug.gone(message.died)
        if gone is not None:
            self._until_done(lambda: gone(matching))
            log.info("MQTT: %s on %s: its streams are stale", message.died.kind, message.topic)
        self._acknowledge(message, "death")

    def _until_done(self, action: Callable[[], object]) -> AppError | None:
        """Run `action` until it is done (None) or refuses (its AppError), waiting while the
        database (or the bus) is away; raises _StoppingError if the service stops meanwhile."""
        away = False
        while True:
            try:
                action()
                if away:
                    log.info("MQTT: committing again")
                return None
            except AppError as exc:
                if exc.status != 503:
                    return exc
                error: Exception = exc
            except UNAVAILABLE as exc:
                error = exc
            if not away:
                log.warning("MQTT: cannot commit now (%s); trying again", error)
                away = True
            if self._stop.wait(RETRY_S):
                raise _StoppingError

    def _refused(self, message: _Message, reason: str, detail: str) -> None:
        if reason not in self._told and reason != "no_readings":
            self._told.add(reason)
            log.warning(
                "MQTT: a message on %s refused (%s): %s (each cause is logged once; "
                "twinwatch_mqtt_messages_total counts them)",
                message.topic,
                reason,
                detail,
            )
        self._acknowledge(message, reason)

    def _acknowledge(self, message: _Message, outcome: str) -> None:
        self.messages.labels(outcome).inc()
        if message.qos:
            with self._guard:
                if self._online and message.connection == self._connection:
                    self.client.ack(message.mid, message.qos)

    def _ask_rebirth(self, topic: sparkplug.Topic) -> None:
        """Publish the node's rebirth command (its births name the aliases its data uses)."""
        node = (topic.group, topic.node)
        now = time.monotonic()
        if now - self._rebirths.get(node, -REBIRTH_EVERY_S) < REBIRTH_EVERY_S:
            return
        self._rebirths[node] = now
        command = f"{sparkplug.NAMESPACE}/{topic.group}/NCMD/{topic.node}"
        self.client.publish(command, sparkplug.rebirth_command(int(time.time() * 1000)), qos=0)
