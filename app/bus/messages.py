"""What travels on the bus: a message's body (the `POST /v1/readings` shape, holding the
batches of one request that fall in one partition), its headers, and the answer a worker sends
back to the API process that waits for it (one line a batch); and how a worker reads the
messages it fetched and groups them into transactions."""

from __future__ import annotations

import time
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from pydantic import ValidationError
from pydantic_core import to_json

from app.errors import AppError, DataError
from app.schemas import PROBLEM_MEDIA_TYPE, ManyReadingsIn, StreamReadingsIn
from app.service.readings import request_size

MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream drops a second message of this id within its window
REPLY_HEADER = "Twinwatch-Reply"  # where the committing worker answers (the API waits there)
RESULTS_HEADER = "Twinwatch-Results"  # "0": the answer without a result per reading
CHANGE_HEADER = "Twinwatch-Change"  # a change of a stream (`app/api/changes.py`), not readings
STREAM_HEADER = "Twinwatch-Stream"  # the stream a change is of


@dataclass(frozen=True)
class Answer:
    """A worker's answer to one stream's batch, as the embedded service would have given it."""

    status: int
    body: bytes
    media_type: str = "application/json"
    results_omitted: bool = False


def body_of(batches: list[bytes]) -> bytes:
    """A message's body: `{"streams": [...]}` of the batches (each `StreamReadingsIn` JSON)."""
    return b'{"streams":[' + b",".join(batches) + b"]}"


def reply_of(answers: list[Answer]) -> bytes:
    """A message's answer: a line for each of its batches, `<status> <omitted> <body>` (the
    bodies are compact JSON: no line breaks)."""
    return b"\n".join(
        b"%d %d %s" % (answer.status, answer.results_omitted, answer.body) for answer in answers
    )


def answers_of(reply: Msg) -> list[Answer]:
    answers: list[Answer] = []
    if not reply.data:  # (a message of no batches)
        return answers
    for line in reply.data.split(b"\n"):
        status, omitted, body = line.split(b" ", 2)
        code = int(status)
        media_type = "application/json" if code < 400 else PROBLEM_MEDIA_TYPE
        answers.append(Answer(code, body, media_type, results_omitted=omitted == b"1"))
    return answers


@dataclass(frozen=True)
class Parsed:
    """A message read: its batches (none if it was not a batch of readings: then the problem
    it is answered with), and whether its sender asked for results."""

    message: Msg
    batches: list[StreamReadingsIn]
    with_results: bool
    problem: AppError | None
    change: str | None = None  # a change of `stream` (`app/api/changes.py`), not readings
    stream: str | None = None


def more_behind(message: Msg) -> bool:
    """Whether the partition held more messages after this one when it was fetched."""
    try:
        return bool(message.metadata.num_pending)
    except (nats.errors.NotJSMessageError, ValueError, IndexError):  # not a JetStream delivery
        return False


def published_at(message: Msg) -> float:
    """When the message reached the bus (the NATS server's clock), as a wall-clock time."""
    try:
        return message.metadata.timestamp.timestamp()
    except (nats.errors.NotJSMessageError, ValueError, IndexError):
        return time.time()


def parse(message: Msg) -> Parsed:
    headers = message.headers or {}
    with_results = headers.get(RESULTS_HEADER, "1") != "0"
    if CHANGE_HEADER in headers:
        return Parsed(message, [], False, None, headers[CHANGE_HEADER], headers.get(STREAM_HEADER))
    try:
        body = ManyReadingsIn.model_validate_json(message.data)
    except ValidationError as exc:  # the API checked it: only a foreign publisher
        problem = DataError(f"not a message of readings: {exc.errors()[0]['msg']}")
        return Parsed(message, [], with_results, problem)
    return Parsed(message, body.streams, with_results, None)


GROUP = 256  # batches committed together at most from one partition


def groups_of(messages: list[Parsed], most_readings: int) -> list[list[Parsed]]:
    """The messages in order, cut where a stream comes again (one request holds a stream
    once), or where a group would hold more than GROUP batches or `most_readings` readings
    (what one request may: a message is one request's at most); a change is a group of its
    own."""
    groups: list[list[Parsed]] = []
    seen: set[str] = set()
    batches = readings = 0
    for one in messages:
        streams = {batch.stream for batch in one.batches}
        count = readings_in(one)
        alone = one.change is not None or (groups and groups[-1][0].change is not None)
        full = batches + len(streams) > GROUP or readings + count > most_readings
        if not groups or alone or not seen.isdisjoint(streams) or full:
            groups.append([])
            seen, batches, readings = set(), 0, 0
        groups[-1].append(one)
        seen |= streams
        batches += len(one.batches)
        readings += count
    return groups


def readings_in(one: Parsed) -> int:
    return request_size([(batch.stream, batch.readings) for batch in one.batches])


def problem_answer(error: AppError) -> Answer:
    return Answer(error.status, to_json(error.problem()), PROBLEM_MEDIA_TYPE)
