"""Where a stream's readings go on the bus, and how a re-sent batch is recognised: pure
functions, the same in every API process and worker.

A stream belongs to one partition for ever: a stable hash of its id over a number of partitions
fixed when the bus is first set up (changing it would move streams between partitions while
their readings wait in them, so it is refused). A message's id is derived from its streams
and their readings' times, so a batch sent again (the same times) is dropped by JetStream's
de-duplication within its window, and after it by ingest, which recognises re-sent readings."""

from __future__ import annotations

import hashlib

import numpy as np

DEFAULT_PARTITIONS = 64
SUBJECT_PREFIX = "twinwatch.readings"


def partition_of(stream_id: str, partitions: int) -> int:
    """The stream's partition in [0, partitions): the same in every process and release
    (blake2b, not Python's salted `hash`)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    digest = hashlib.blake2b(stream_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def subject_of(partition: int) -> str:
    return f"{SUBJECT_PREFIX}.{partition}"


def message_id(batches: list[tuple[str, np.ndarray]]) -> str:
    """`Nats-Msg-Id` of a message: its streams, how many readings and a digest of their
    times (int64 microseconds): `<stream>/<readings>/<digest>` for one stream,
    `<first stream>+<more streams>/...` for several."""
    digest = hashlib.blake2b(digest_size=16)
    readings = 0
    for stream_id, times in batches:
        digest.update(stream_id.encode() + b"\0")
        digest.update(np.ascontiguousarray(times, dtype="<i8").tobytes())
        readings += times.shape[0]
    first = batches[0][0] if len(batches) == 1 else f"{batches[0][0]}+{len(batches) - 1}"
    return f"{first}/{readings}/{digest.hexdigest()}"
