"""What travels on the bus: a message's body (the `POST /v1/readings` shape, holding the
batches of one request that fall in one partition), its headers, and the answer a worker sends
back to the API process that waits for it (one line a batch)."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg

from app.schemas import PROBLEM_MEDIA_TYPE

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
