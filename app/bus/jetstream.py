"""The NATS JetStream the API processes and workers share (nats-py): one stream holding every
partition's readings, a key-value bucket for the bus's fixed settings and one for the
partitions' leases. Thin: what goes where is `partitions.py`, who owns what `leases.py`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from dataclasses import dataclass

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from app.bus.partitions import SUBJECT_PREFIX, subject_of
from app.errors import DataError

STREAM = "TWINWATCH_READINGS"
SETTINGS_BUCKET = "twinwatch_bus"
LEASES_BUCKET = "twinwatch_leases"
DUPLICATE_WINDOW_S = 120.0
"""How long JetStream remembers a message id: a batch re-sent within it is dropped there
(after it, ingest recognises its readings as re-sent)."""


class Replies:
    """Where a process waits for workers' answers: one subscription of its own (`<inbox>.*`),
    each awaited answer a subject under it, instead of a subscription per message."""

    def __init__(self, connection: Client) -> None:
        self.connection = connection
        self.prefix = connection.new_inbox()
        self.waiting: dict[str, asyncio.Future[Msg]] = {}
        self.subscription: Subscription | None = None
        self.subscribing = asyncio.Lock()  # (requests that come together subscribe once)

    async def expect(self) -> tuple[str, asyncio.Future[Msg]]:
        """A subject to be answered at, and the answer to come."""
        async with self.subscribing:
            if self.subscription is None:
                self.subscription = await self.connection.subscribe(
                    f"{self.prefix}.*", cb=self._arrived
                )
        token = uuid.uuid4().hex
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        return f"{self.prefix}.{token}", future

    def forget(self, subject: str) -> None:
        self.waiting.pop(subject.rsplit(".", 1)[1], None)

    async def _arrived(self, message: Msg) -> None:
        future = self.waiting.pop(message.subject.rsplit(".", 1)[1], None)
        if future is not None and not future.done():
            future.set_result(message)


@dataclass
class Bus:
    """A connection to the bus, set up (`open_bus`)."""

    connection: Client
    jetstream: JetStreamContext
    partitions: int
    leases: KeyValue
    lease_s: float
    replies: Replies | None = None  # where this process waits for answers (made when needed)

    async def close(self) -> None:
        await self.connection.drain()

    async def consumer(
        self, partition: int, *, ack_wait_s: float, batch: int
    ) -> JetStreamContext.PullSubscription:
        """A consumer of the partition of its own, bound; any other of the partition deleted
        first. The stream is a work queue (an acknowledged batch leaves it), so the new
        consumer starts at the first batch not acknowledged: a new owner, or one the database
        kept waiting, goes on from there in order, without waiting for a dead owner's
        deliveries to time out. Its own name, so a fetch the previous owner still has in
        flight (paused, then woken) reaches a consumer that is gone, never this one."""
        subject = subject_of(partition)
        for info in await self.jetstream.consumers_info(STREAM):
            if info.config.filter_subject == subject:
                with contextlib.suppress(NotFoundError):
                    await self.jetstream.delete_consumer(STREAM, info.name)
        name = f"partition-{partition}-{uuid.uuid4().hex[:12]}"
        await self.jetstream.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=name,
                filter_subject=subject,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=ack_wait_s,
                max_ack_pending=batch,
                max_deliver=-1,
            ),
        )
        return await self.jetstream.pull_subscribe_bind(durable=name, stream=STREAM)


HEADROOM = 4096
"""Bytes of a message's largest size (the server's max_payload) left for its headers."""


def fits(bus: Bus) -> int:
    """The largest body a message on this bus may carry."""
    return int(bus.connection.max_payload) - HEADROOM


def worker_name() -> str:
    """A name that says where the worker runs and tells two of them apart."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def connect(url: str, *, name: str) -> tuple[Client, JetStreamContext]:
    connection = await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5
    )
    return connection, connection.jetstream()


async def open_bus(
    url: str, *, name: str, partitions: int, lease_s: float, replicas: int = 1
) -> Bus:
    """Connect, and set the bus up the first time: the stream, and the number of partitions
    (kept in the settings bucket; a different number later is refused, since moving streams
    between partitions while their readings wait in them could reorder them). `replicas`:
    copies JetStream keeps of the stream and the buckets (a NATS cluster of 3 survives the
    loss of a server with 3)."""
    connection, jetstream = await connect(url, name=name)
    try:
        await _ensure_stream(jetstream, replicas)
        fixed = await _fixed_partitions(jetstream, partitions, replicas)
        leases = await _bucket(
            jetstream, KeyValueConfig(bucket=LEASES_BUCKET, ttl=lease_s, replicas=replicas)
        )
        # The bucket's, set by whoever made it first: every process beats by the same clock.
        lease_s = (await leases.status()).ttl or lease_s
    except BaseException:
        await connection.close()
        raise
    return Bus(connection, jetstream, fixed, leases, lease_s)


async def _ensure_stream(jetstream: JetStreamContext, replicas: int) -> None:
    try:
        await jetstream.stream_info(STREAM)
    except NotFoundError:
        await jetstream.add_stream(
            StreamConfig(
                name=STREAM,
                subjects=[f"{SUBJECT_PREFIX}.*"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.WORK_QUEUE,  # a batch acknowledged is done
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )


async def _bucket(jetstream: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await jetstream.key_value(config.bucket)
    except BucketNotFoundError:
        return await jetstream.create_key_value(config)


async def _fixed_partitions(jetstream: JetStreamContext, partitions: int, replicas: int) -> int:
    settings = await _bucket(
        jetstream,
        KeyValueConfig(bucket=SETTINGS_BUCKET, storage=StorageType.FILE, replicas=replicas),
    )
    with contextlib.suppress(KeyWrongLastSequenceError):  # set up before: its number stands
        await settings.create("settings", json.dumps({"partitions": partitions}).encode())
    try:
        entry = await settings.get("settings")
    except KeyNotFoundError as exc:
        raise DataError("the bus's settings were removed while it starts: start again") from exc
    fixed = int(json.loads(entry.value or b"{}")["partitions"])
    if fixed != partitions:
        raise DataError(
            f"the bus was set up with {fixed} partitions, not {partitions}: the number is fixed "
            "(TWINWATCH_BUS_PARTITIONS)"
        )
    return fixed
