"""Changes of a stream that, on the bus, its worker makes: its configuration (`PUT` of a stream
that exists), its model version (a switch, a promotion, a roll-back) and its deletion.

The worker holding a stream holds its state, and its readings wait in order in the stream's
partition: a change made beside them would race them. So an API process on the bus publishes
the change to that partition, after the readings sent before it and before those sent after;
the worker, taking it in its turn, runs the same operation the embedded service runs
(app/bus/changes.py), under the partition's fence (app/bus/worker.py), and answers with what it
answered."""

from __future__ import annotations

import json
from functools import partial

import anyio.from_thread
from fastapi import Response

from app.api.deps import AppState
from app.bus.publisher import BusAwayError, NotAnsweredError, change
from app.errors import ForwardedError, UnavailableError


def forward(state: AppState, kind: str, stream_id: str, body: bytes = b"") -> Response:
    """The change published to the stream's partition, and the worker's answer to it."""
    assert state.bus is not None
    try:
        answer = anyio.from_thread.run(
            partial(change, state.bus, stream_id, kind, body, wait_s=state.settings.bus_wait_s)
        )
    except BusAwayError as exc:
        raise UnavailableError(
            f"the bus (NATS) did not confirm it stored the change ({exc}): nothing changed; "
            "send it again"
        ) from None
    except NotAnsweredError:
        raise UnavailableError(
            f"no worker made the change within {state.settings.bus_wait_s:g} s; it waits on "
            "the bus behind the stream's readings and will be made once: read the stream to "
            "see when"
        ) from None
    if answer.status >= 400:
        raise ForwardedError(answer.status, json.loads(answer.body))
    if not answer.body:  # (204: no content, and no content type)
        return Response(status_code=answer.status)
    return Response(answer.body, answer.status, media_type=answer.media_type or None)
