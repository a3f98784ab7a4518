"""The NATS JetStream the API processes and workers share (nats-py): one stream holding every
partition's readings, a key-value bucket for the bus's fixed settings and one for the
partitions' leases. Thin: what goes where is `partitions.py`, who owns what `leases.py`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from dataclasses import dataclass

import nats
from nats.aio.client import Client
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


@dataclass
class Bus:
    """A connection to the bus, set up (`open_bus`)."""

    connection: Client
    jetstream: JetStreamContext
    partitions: int
    leases: KeyValue
    lease_s: float

    async def close(self) -> None:
        await self.connection.drain()

    async def consumer(
        self, partition: int, *, ack_wait_s: float, batch: int
    ) -> JetStreamContext.PullSubscription:
        """A fresh consumer of the partition, bound. The stream is a work queue (an
        acknowledged batch leaves it), so a fresh consumer starts at the first batch not
        acknowledged: a new owner, or one the database kept waiting, goes on from there in
        order, without waiting for a dead owner's deliveries to time out."""
        name = f"partition-{partition}"
        with contextlib.suppress(NotFoundError):
            await self.jetstream.delete_consumer(STREAM, name)
        await self.jetstream.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=name,
                filter_subject=subject_of(partition),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=ack_wait_s,
                max_ack_pending=batch,
                max_deliver=-1,
            ),
        )
        return await self.jetstream.pull_subscribe_bind(durable=name, stream=STREAM)


def worker_name() -> str:
    """A name that says where the worker runs and tells two of them apart."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def connect(url: str, *, name: str) -> tuple[Client, JetStreamContext]:
    connection = await nats.connect(
        url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5
    )
    return connection, connection.jetstream()


async def open_bus(url: str, *, name: str, partitions: int, lease_s: float) -> Bus:
    """Connect, and set the bus up the first time: the stream, and the number of partitions
    (kept in the settings bucket; a different number later is refused, since moving streams
    between partitions while their readings wait in them could reorder them)."""
    connection, jetstream = await connect(url, name=name)
    try:
        await _ensure_stream(jetstream)
        fixed = await _fixed_partitions(jetstream, partitions)
        leases = await _bucket(jetstream, KeyValueConfig(bucket=LEASES_BUCKET, ttl=lease_s))
    except BaseException:
        await connection.close()
        raise
    return Bus(connection, jetstream, fixed, leases, lease_s)


async def _ensure_stream(jetstream: JetStreamContext) -> None:
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
            )
        )


async def _bucket(jetstream: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await jetstream.key_value(config.bucket)
    except BucketNotFoundError:
        return await jetstream.create_key_value(config)


async def _fixed_partitions(jetstream: JetStreamContext, partitions: int) -> int:
    settings = await _bucket(
        jetstream, KeyValueConfig(bucket=SETTINGS_BUCKET, storage=StorageType.FILE)
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
