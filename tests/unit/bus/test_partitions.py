"""Where a stream's readings go on the bus, and a batch's message id: the same in every
process and release (never Python's salted hash), spread evenly, and a re-sent batch's id is
its first copy's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from app.bus.partitions import message_id, partition_of, subject_of


def test_a_stream_has_one_partition_for_ever() -> None:
    # Pinned: a different answer in a later release would move streams while their readings
    # wait on the bus.
    assert [partition_of(name, 64) for name in ("pump-1", "pump-2", "bearing-7")] == [
        partition_of("pump-1", 64),
        partition_of("pump-2", 64),
        partition_of("bearing-7", 64),
    ]
    assert partition_of("pump-1", 64) == PINNED["pump-1"]
    assert partition_of("bearing-7", 64) == PINNED["bearing-7"]
    assert subject_of(partition_of("pump-1", 64)) == f"twinwatch.readings.{PINNED['pump-1']}"
    assert partition_of("anything", 1) == 0
    with pytest.raises(ValueError):
        partition_of("pump-1", 0)


PINNED = {"pump-1": 28, "bearing-7": 39}  # blake2b of the id, over 64


def test_streams_spread_evenly() -> None:
    counts = Counter(partition_of(f"sensor-{index:05d}", 64) for index in range(64_000))
    assert len(counts) == 64
    assert min(counts.values()) > 850 and max(counts.values()) < 1150


def test_a_batch_is_known_by_its_stream_and_times() -> None:
    times = np.arange(5, dtype=np.int64) * 100_000 + 1_700_000_000_000_000
    same = message_id([("pump-1", times.copy())])
    assert message_id([("pump-1", times)]) == same
    assert message_id([("pump-2", times)]) != same
    assert message_id([("pump-1", times[:4])]) != same
    assert message_id([("pump-1", times + 1)]) != same
    assert same.startswith("pump-1/5/")


def test_a_message_of_many_streams_is_known_by_all_of_them() -> None:
    times = np.arange(3, dtype=np.int64) * 100_000 + 1_700_000_000_000_000
    both = message_id([("pump-1", times), ("pump-2", times)])
    assert both.startswith("pump-1+1/6/")
    assert message_id([("pump-1", times), ("pump-2", times)]) == both
    assert message_id([("pump-2", times), ("pump-1", times)]) != both
    assert message_id([("pump-1", times), ("pump-3", times)]) != both
    # Stream ids are kept apart: "ab" + "c" is not "a" + "bc".
    assert message_id([("ab", times[:0]), ("c", times)]) != message_id(
        [("a", times[:0]), ("bc", times)]
    )
