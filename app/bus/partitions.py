"""Where a stream's readings go on the bus, and how a re-sent batch is recognised: pure
functions, the same in every API process and worker.

A stream belongs to one partition for ever: a stable hash of its id over a number of partitions
fixed when the bus is first set up (changing it would move streams between partitions while
their readings wait in them, so it is refused). A batch's message id is derived from the stream
and its readings' times, so a batch sent again (the same times) is dropped by JetStream's
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


def message_id(stream_id: str, times: np.ndarray) -> str:
    """`Nats-Msg-Id` of a batch: its stream, how many readings and a digest of their times
    (int64 microseconds)."""
    digest = hashlib.blake2b(np.ascontiguousarray(times, dtype="<i8").tobytes(), digest_size=16)
    return f"{stream_id}/{times.shape[0]}/{digest.hexdigest()}"
