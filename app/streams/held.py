"""A stream as it is held between requests, and what a transaction holds until it ends: the
streams' locks (released when it ends), the streams it restored (remembered only if it
commits) and the callbacks of its end (`LiveStreams.on_end`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from app.learning.learn import LearnedModel
from app.streams.blocks import StreamState
from app.streams.learning import Learning
from app.streams.recurrence import Recurrence

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveStream:
    """A stream as it is held between requests."""

    stream_id: str
    model_name: str  # what its alarm rows name (a learned model: `learned_name` of the stream)
    model_version: str
    channels: list[str]
    has_reference: bool
    sample_period_s: float  # infinite while learning (no gap restarts a model-less stream)
    recurrence: Recurrence
    state: StreamState
    checkpoint_due: int  # write the next checkpoint once the stream has seen this many readings
    saved_samples: int | None  # the readings its stored checkpoint has seen (None: it has none)
    # The peak of each alarm open after the last request, as its row holds it: a request that
    # moves none touches no alarm row.
    open_peaks: dict[str, float] = field(default_factory=dict)
    learning: Learning | None = None  # a stream of model "auto" that has not learned yet
    learned: LearnedModel | None = None  # what a stream of model "auto" learned
    revised_from: int = 0  # a learned stream: the sample its current thresholds apply from
    # A learned stream, on its readings' clock (microseconds): when it learns again, and when
    # the relearned candidate shadowing it is decided on (app/learning/relearn.py).
    relearn_at: int | None = None
    prove_at: int | None = None
    # When its last readings were accepted (time.monotonic), and the sample at which its open
    # stale alarm began, if it has one (app/streams/stale.py).
    last_arrival: float = field(default_factory=time.monotonic)
    stale_since: int | None = None

    @property
    def phase(self) -> str:
        return "learning" if self.learning is not None else "monitoring"


@dataclass(slots=True)
class Slot:
    """A known stream's lock, and its live state once restored."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    live: LiveStream | None = None


@dataclass
class Pending:
    """What a session holds until its transaction ends: streams (their slots, locked), the
    streams it restored (remembered if it commits) and callbacks."""

    held: dict[str, Slot] = field(default_factory=dict)
    restored: dict[str, LiveStream] = field(default_factory=dict)
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    on_rollback: list[Callable[[], None]] = field(default_factory=list)
    committed: bool = False

    def end(self) -> None:
        if self.committed:
            for stream_id, live in self.restored.items():
                self.held[stream_id].live = live
        callbacks = self.on_commit if self.committed else self.on_rollback
        try:
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("a callback at the end of a transaction failed")
        finally:
            for slot in reversed(self.held.values()):
                slot.lock.release()
            self.held.clear()


_PENDING = "twinwatch.pending"


def pending_of(session: Session) -> Pending:
    """What `session` holds, begun with its transaction if it has none."""
    pending = session.info.get(_PENDING)
    if not isinstance(pending, Pending):
        if not session.in_transaction():
            session.begin()  # (no SQL yet: its end is what releases what it holds)
        pending = session.info[_PENDING] = Pending()
    return pending


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    pending = session.info.get(_PENDING)
    if isinstance(pending, Pending):
        pending.committed = True


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return  # a nested transaction
    pending = session.info.pop(_PENDING, None)
    if isinstance(pending, Pending):
        pending.end()
