"""How a request's batches become messages (one a partition, cut to the largest message the
server takes) and how a worker's answer to a message travels back (a line a batch)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from app.bus.jetstream import HEADROOM, Bus
from app.bus.messages import Answer, answers_of, body_of, reply_of
from app.bus.partitions import partition_of
from app.bus.publisher import Batch, _messages, change
from app.errors import PayloadTooLargeError


def fake_bus(partitions: int, largest_body: int) -> Bus:
    connection = SimpleNamespace(max_payload=largest_body + HEADROOM)
    return cast(Bus, SimpleNamespace(connection=connection, partitions=partitions))


def one_batch(stream: str, readings: int = 1) -> Batch:
    items = [{"t": 1_767_225_600.0 + i / 10, "value": float(i)} for i in range(readings)]
    body = json.dumps({"stream": stream, "readings": items}, separators=(",", ":")).encode()
    return Batch(stream, body, np.arange(readings, dtype=np.int64))


def test_a_request_goes_as_one_message_a_partition_in_its_order() -> None:
    batches = [one_batch(f"pump-{index}") for index in range(20)]
    messages = _messages(fake_bus(4, 1 << 20), batches)
    assert sorted(index for m in messages for index in m.indexes) == list(range(20))
    assert len(messages) == len({partition_of(b.stream_id, 4) for b in batches})
    for message in messages:
        assert message.indexes == sorted(message.indexes)
        assert {partition_of(batches[i].stream_id, 4) for i in message.indexes} == {
            message.partition
        }
        body = json.loads(message.body)
        assert [item["stream"] for item in body["streams"]] == [
            batches[i].stream_id for i in message.indexes
        ]


def test_a_partition_s_batches_are_cut_to_fit_a_message() -> None:
    batches = [one_batch(f"pump-{index}", readings=3) for index in range(10)]
    size = len(batches[0].body)
    messages = _messages(fake_bus(1, 3 * size + 40), batches)
    assert [m.indexes for m in messages] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(len(m.body) <= 3 * size + 40 for m in messages)
    assert len({m.msg_id for m in messages}) == len(messages)


def test_a_change_too_large_for_a_message_is_refused_before_it_is_published() -> None:
    """(413, not the 503 of a bus that did not store it: sending it again would not help.)"""
    config = json.dumps({"detectors": {"point": {"threshold": 4.5}}, "note": "x" * 600})
    with pytest.raises(PayloadTooLargeError) as refused:
        asyncio.run(change(fake_bus(4, 500), "pump-1", "configure", config.encode(), wait_s=1))
    assert refused.value.status == 413 and refused.value.extra["stream"] == "pump-1"


def test_one_stream_s_batch_too_large_for_a_message_is_refused_by_name() -> None:
    batches = [one_batch("small"), one_batch("large", readings=50)]
    with pytest.raises(PayloadTooLargeError) as refused:
        _messages(fake_bus(4, 500), batches)
    assert refused.value.extra["stream"] == "large"


def test_a_worker_s_answer_comes_back_a_batch_a_line() -> None:
    answers = [
        Answer(200, b'{"accepted":1,"duplicates":0}'),
        Answer(404, b'{"title":"Not found","detail":"a\\nb"}', "application/problem+json"),
        Answer(200, b'{"accepted":2}', results_omitted=True),
    ]
    reply: Any = SimpleNamespace(data=reply_of(answers))
    assert answers_of(reply) == answers


def test_a_message_body_is_the_many_streams_request() -> None:
    assert json.loads(body_of([b'{"stream":"a","readings":[]}'])) == {
        "streams": [{"stream": "a", "readings": []}]
    }
    assert json.loads(body_of([])) == {"streams": []}


def parsed(*streams: tuple[str, int]) -> Any:
    """A message read by a worker: (stream, readings) batches."""
    from app.bus.messages import Parsed
    from app.schemas import StreamReadingsIn

    batches = [
        StreamReadingsIn.model_validate(
            {
                "stream": name,
                "readings": [{"t": 1_767_225_600.0 + i, "value": 0.0} for i in range(count)],
            }
        )
        for name, count in streams
    ]
    return Parsed(cast(Any, None), batches, False, None)


def test_a_worker_groups_distinct_streams_up_to_a_request_s_readings() -> None:
    from app.bus.messages import Parsed, groups_of

    change = Parsed(cast(Any, None), [], False, None, change="switch", stream="d")
    messages = [
        parsed(("a", 3), ("b", 3)),  # 6 readings: as many as a group may hold
        parsed(("c", 3)),
        parsed(("d", 1)),  # with c's: 4 readings
        parsed(("c", 1)),  # c again: a new group
        parsed(("e", 6)),  # 1 + 6 readings: a new group
        change,  # alone
        parsed(("f", 1)),
    ]
    groups = groups_of(messages, most_readings=6)
    sizes = [[len(one.batches) for one in group] for group in groups]
    assert sizes == [[2], [1, 1], [1], [1], [0], [1]]
    assert groups[4] == [change]
