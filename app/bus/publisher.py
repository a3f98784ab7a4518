"""What an API process does with a batch on the bus: publish it to its stream's partition and
wait for the answer of the worker that commits it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

import nats.errors
import numpy as np
from nats.js.api import PubAck

from app.bus.jetstream import Bus, fits
from app.bus.messages import (
    MSG_ID_HEADER,
    OMITTED_HEADER,
    REPLY_HEADER,
    RESULTS_HEADER,
    STATUS_HEADER,
    Answer,
)
from app.bus.partitions import message_id, partition_of, subject_of
from app.errors import PayloadTooLargeError


class BusAwayError(Exception):
    """The bus did not store the batch (NATS is away): nothing happened; send it again."""


@dataclass(frozen=True)
class Batch:
    """One stream's readings as they travel: `StreamReadingsIn` as JSON, and the readings'
    times (microseconds) that name the batch."""

    stream_id: str
    body: bytes
    times: np.ndarray


class NotAnsweredError(Exception):
    """No worker answered in time: the batch is stored on the bus and will be committed once;
    re-sending it is safe."""


async def submit(
    bus: Bus, stream_id: str, body: bytes, times: np.ndarray, *, with_results: bool, wait_s: float
) -> Answer:
    """Publish one stream's batch (`StreamReadingsIn` as JSON; `times` its readings' times in
    microseconds) and wait up to `wait_s` for the committing worker's answer."""
    _fits(bus, body)
    connection = bus.connection
    inbox = connection.new_inbox()
    try:
        answers = await connection.subscribe(inbox, max_msgs=1)
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusAwayError(str(exc) or type(exc).__name__) from exc
    headers = {
        MSG_ID_HEADER: message_id(stream_id, times),
        REPLY_HEADER: inbox,
        RESULTS_HEADER: "1" if with_results else "0",
    }
    try:
        stored = await _publish(bus, stream_id, body, headers)
        if stored.duplicate:
            # Sent before, within the de-duplication window: that copy is (or was) answered
            # to its own sender. This one goes after it in the partition, under a name of its
            # own, to be answered here: its readings are re-sent ones by then.
            headers[MSG_ID_HEADER] += f"/again/{uuid.uuid4().hex}"
            await _publish(bus, stream_id, body, headers)
        try:
            message = await answers.next_msg(timeout=wait_s)
        except TimeoutError as exc:
            raise NotAnsweredError() from exc
    finally:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await answers.unsubscribe()
    headers = message.headers or {}
    return Answer(
        int(headers.get(STATUS_HEADER, "200")),
        message.data,
        headers.get("Content-Type", "application/json"),
        results_omitted=headers.get(OMITTED_HEADER) == "1",
    )


async def submit_all(
    bus: Bus, batches: list[Batch], *, with_results: bool, wait_s: float
) -> list[Answer]:
    """Each batch to its partition, side by side; the answers in the batches' order. (Every
    batch's size is checked before any is published.)"""
    for batch in batches:
        _fits(bus, batch.body)
    return list(
        await asyncio.gather(
            *(
                submit(bus, b.stream_id, b.body, b.times, with_results=with_results, wait_s=wait_s)
                for b in batches
            )
        )
    )


async def store_all(bus: Bus, batches: list[Batch]) -> None:
    """Each batch stored on the bus, no answer awaited (`?wait=false`)."""
    for batch in batches:
        _fits(bus, batch.body)
    await asyncio.gather(
        *(
            _publish(bus, b.stream_id, b.body, {MSG_ID_HEADER: message_id(b.stream_id, b.times)})
            for b in batches
        )
    )


async def _publish(bus: Bus, stream_id: str, body: bytes, headers: dict[str, str]) -> PubAck:
    try:
        return await bus.jetstream.publish(
            subject_of(partition_of(stream_id, bus.partitions)), body, headers=headers
        )
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusAwayError(str(exc) or type(exc).__name__) from exc


def _fits(bus: Bus, body: bytes) -> None:
    largest = fits(bus)
    if len(body) > largest:
        raise PayloadTooLargeError(
            f"one stream's batch is {len(body)} bytes on the bus, which carries at most "
            f"{largest} (the NATS server's max_payload, less its headers): send it in parts",
            reason="too_large",
        )
