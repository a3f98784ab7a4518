"""What an API process does with a request's readings on the bus: publish them, one message for
each partition they fall in, and wait for the answers of the workers that commit them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import nats.errors
import numpy as np
from nats.js.api import PubAck

from app.bus.jetstream import Bus, Replies, fits
from app.bus.messages import (
    CHANGE_HEADER,
    MSG_ID_HEADER,
    REPLY_HEADER,
    RESULTS_HEADER,
    STREAM_HEADER,
    Answer,
    answers_of,
    body_of,
)
from app.bus.partitions import message_id, partition_of, subject_of
from app.errors import PayloadTooLargeError
from app.schemas import ReadingIn, StreamReadingsIn
from app.storage.repositories.readings import micros


class BusAwayError(Exception):
    """The bus did not store the batch (NATS is away): nothing happened; send it again."""


class NotAnsweredError(Exception):
    """No worker answered in time: the batch is stored on the bus and will be committed once;
    re-sending it is safe."""


@dataclass(frozen=True)
class Batch:
    """One stream's readings as they travel: `StreamReadingsIn` as JSON, and the readings'
    times (microseconds) that name the batch."""

    stream_id: str
    body: bytes
    times: np.ndarray


def batches_of(items: list[tuple[str, list[ReadingIn]]]) -> list[Batch]:
    """A request's readings as the batches that travel: one per stream."""
    return [
        Batch(
            stream_id,
            StreamReadingsIn.model_construct(stream=stream_id, readings=readings)
            .model_dump_json()
            .encode(),
            micros([reading.t for reading in readings]),
        )
        for stream_id, readings in items
    ]


@dataclass(frozen=True)
class _Message:
    """Batches of one partition, of one request, in the request's order: one message."""

    partition: int
    indexes: list[int]  # the batches', in the request
    body: bytes
    msg_id: str


_UNANSWERED = Answer(
    500,
    b'{"type":"https://twinwatch.dev/problems/internal-error","title":"Internal server error",'
    b'"status":500,"detail":"the worker answered none of the batches (it has been logged)"}',
    "application/problem+json",
)


async def submit_all(
    bus: Bus, batches: list[Batch], *, with_results: bool, wait_s: float
) -> list[Answer]:
    """Publish the batches (a message for each partition they fall in) and wait up to
    `wait_s` for the committing workers' answers: one for each batch, in the batches' order.
    (Every message's size is checked before any is published.)"""
    messages = _messages(bus, batches)
    answered = await asyncio.gather(
        *(
            _submit(bus, message, {RESULTS_HEADER: "1" if with_results else "0"}, wait_s=wait_s)
            for message in messages
        )
    )
    answers: list[Answer | None] = [None] * len(batches)
    for message, ones in zip(messages, answered, strict=True):
        if len(ones) != len(message.indexes):  # a whole message refused: its one answer
            ones = (ones or [_UNANSWERED])[:1] * len(message.indexes)
        for index, answer in zip(message.indexes, ones, strict=True):
            answers[index] = answer
    return [answer for answer in answers if answer is not None]


async def submit(
    bus: Bus, stream_id: str, body: bytes, times: np.ndarray, *, with_results: bool, wait_s: float
) -> Answer:
    """One stream's batch (`StreamReadingsIn` as JSON; `times` its readings' times in
    microseconds), and the answer of the worker that commits it."""
    (answer,) = await submit_all(
        bus, [Batch(stream_id, body, times)], with_results=with_results, wait_s=wait_s
    )
    return answer


async def store_all(bus: Bus, batches: list[Batch]) -> None:
    """The batches stored on the bus, no answer awaited (`?wait=false`)."""
    messages = _messages(bus, batches)
    await asyncio.gather(
        *(_publish(bus, m.partition, m.body, {MSG_ID_HEADER: m.msg_id}) for m in messages)
    )


async def change(bus: Bus, stream_id: str, kind: str, body: bytes, *, wait_s: float) -> Answer:
    """A change of a stream (`app/api/changes.py`) through its partition, behind the readings
    published before it, and the answer of the worker that makes it."""
    if len(body) > fits(bus):
        raise PayloadTooLargeError(
            f"the change of stream {stream_id!r} is {len(body)} bytes, more than a message on "
            f"the bus carries ({fits(bus)})",
            reason="too_large",
            stream=stream_id,
        )
    message = _Message(partition_of(stream_id, bus.partitions), [0], body, uuid.uuid4().hex)
    headers = {CHANGE_HEADER: kind, STREAM_HEADER: stream_id}
    (answer,) = await _submit(bus, message, headers, wait_s=wait_s)
    return answer


async def _submit(
    bus: Bus, message: _Message, headers: dict[str, str], *, wait_s: float
) -> list[Answer]:
    if bus.replies is None:
        bus.replies = Replies(bus.connection)
    replies = bus.replies
    try:
        inbox, answer = await replies.expect()
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusAwayError(str(exc) or type(exc).__name__) from exc
    headers = headers | {MSG_ID_HEADER: message.msg_id, REPLY_HEADER: inbox}
    try:
        stored = await _publish(bus, message.partition, message.body, headers)
        if stored.duplicate:
            # Sent before, within the de-duplication window: that copy is (or was) answered
            # to its own sender. This one goes after it in the partition, under a name of its
            # own, to be answered here: its readings are re-sent ones by then.
            headers[MSG_ID_HEADER] += f"/again/{uuid.uuid4().hex}"
            await _publish(bus, message.partition, message.body, headers)
        try:
            reply = await asyncio.wait_for(asyncio.shield(answer), timeout=wait_s)
        except TimeoutError as exc:
            raise NotAnsweredError() from exc
    finally:
        replies.forget(inbox)
    return answers_of(reply)


def _messages(bus: Bus, batches: list[Batch]) -> list[_Message]:
    """The batches by partition, each partition's in as few messages as fit."""
    largest = fits(bus)
    by_partition: dict[int, list[int]] = {}
    for index, batch in enumerate(batches):
        if len(body_of([batch.body])) > largest:
            raise PayloadTooLargeError(
                f"stream {batch.stream_id!r}'s batch is {len(batch.body)} bytes on the bus, "
                f"which carries at most {largest} in a message (the NATS server's max_payload, "
                "less its headers): send it in parts",
                reason="too_large",
                stream=batch.stream_id,
            )
        by_partition.setdefault(partition_of(batch.stream_id, bus.partitions), []).append(index)
    messages = []
    for partition, indexes in by_partition.items():
        size, part = 0, list[int]()
        for index in indexes:
            length = len(batches[index].body) + 1
            if part and size + length > largest - len(body_of([])):
                messages.append(_message(partition, part, batches))
                size, part = 0, []
            size += length
            part.append(index)
        messages.append(_message(partition, part, batches))
    return messages


def _message(partition: int, indexes: list[int], batches: list[Batch]) -> _Message:
    ones = [batches[index] for index in indexes]
    return _Message(
        partition,
        indexes,
        body_of([batch.body for batch in ones]),
        message_id([(batch.stream_id, batch.times) for batch in ones]),
    )


async def _publish(bus: Bus, partition: int, body: bytes, headers: dict[str, str]) -> PubAck:
    try:
        return await bus.jetstream.publish(subject_of(partition), body, headers=headers)
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusAwayError(str(exc) or type(exc).__name__) from exc
