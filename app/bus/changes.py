"""The changes of a stream its worker makes on the bus (`app/api/changes.py` says why they go
through the stream's partition): each kind's body read as the API reads it, the service's
operation run (app/service/streams.py), and its result made the answer the API process relays."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from app.bus.messages import Answer
from app.schemas import ModelChoice, StreamConfig
from app.service import streams as service
from app.service.engine import ServiceState

Handler = Callable[[ServiceState, Session, str, bytes], Answer]
"""(the worker's state, the transaction, the stream, the body the API process published) ->
the answer."""


def _configure(state: ServiceState, session: Session, stream_id: str, body: bytes) -> Answer:
    configured = service.configure(
        state, session, stream_id, StreamConfig.model_validate_json(body)
    )
    return Answer(201 if configured.created else 200, configured.stream.model_dump_json().encode())


def _switch(state: ServiceState, session: Session, stream_id: str, body: bytes) -> Answer:
    answer = service.switch(state, session, stream_id, ModelChoice.model_validate_json(body))
    return Answer(200, answer.model_dump_json().encode())


def _delete(state: ServiceState, session: Session, stream_id: str, body: bytes) -> Answer:
    service.delete(state, session, stream_id)
    return Answer(204, b"", "")


CHANGES: dict[str, Handler] = {"configure": _configure, "switch": _switch, "delete": _delete}
