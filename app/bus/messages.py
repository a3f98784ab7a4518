"""What travels on the bus besides a batch's body (`StreamReadingsIn` as JSON): its headers,
and the answer a worker sends back to the API process that waits for it."""

from __future__ import annotations

from dataclasses import dataclass

MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream drops a second message of this id within its window
REPLY_HEADER = "Twinwatch-Reply"  # where the committing worker answers (the API waits there)
RESULTS_HEADER = "Twinwatch-Results"  # "0": the answer without a result per reading
STATUS_HEADER = "Twinwatch-Status"  # the HTTP status the answer stands for
OMITTED_HEADER = "Twinwatch-Results-Omitted"  # "1": the results would not fit in a message


@dataclass(frozen=True)
class Answer:
    """A worker's answer to a batch, as the embedded service would have given it."""

    status: int
    body: bytes
    media_type: str = "application/json"
    results_omitted: bool = False
