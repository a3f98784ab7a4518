"""The live streams: each stream's state in memory, restored from the database when first touched.

The database holds every accepted reading and, every `checkpoint_every` readings, a checkpoint
of the stream's state. A stream that is not in memory (after a start, a failed transaction or
a reconfiguration) is restored from its checkpoint and the readings stored after it, run through
the same recurrence: since the recurrence gives the same result however readings are grouped,
the restored state is exactly the one the stream had.

One request at a time works on a stream: `hold` takes the streams' locks (in a fixed order, so
two requests never deadlock) and keeps them until the caller's transaction ends. If it rolls
back, the streams it moved are dropped from memory and restored from what was committed.

Beside it: what a transaction holds (`held.py`), what processes a stream (`kinds.py`), the
changes of what a stream runs: a fit adopted, a revision, a switch (`handover.py`), and its
stored readings run again for a read (`recomputed.py`).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy.orm import Session

from app import catalogue
from app.errors import ArtifactError, DataError
from app.learning.adapt import next_revision
from app.registry import AUTO, ModelRegistry, learned_name
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.models import Stream, StreamCheckpoint
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.blocks import Readings, StreamState
from app.streams.held import LiveStream, Slot, pending_of
from app.streams.kinds import Kind, Kinds
from app.streams.learning import Replayed, replay
from app.streams.recomputed import joined
from app.streams.recurrence import (
    DEFAULT_MAX_GAP,
    READABLE_STATE_VERSIONS,
    STATE_VERSION,
    Recurrence,
)

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_EVERY = 1000
"""Readings between two checkpoints of a stream: what a restart replays at most."""

RESTORED_TOGETHER = 1000
"""Streams restored from one set of queries (their rows, checkpoints and readings since)."""

SAVED_TOGETHER = 1000
"""Streams whose checkpoints a stop writes in one transaction (one statement each table)."""


@dataclass
class Restoring:
    """How far the restore of every stream at start-up has come: it runs behind an open port,
    and readiness says how far it is."""

    total: int | None = None  # (not counted yet)
    done: int = 0
    finished: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> str:
        if self.finished and self.total is not None and self.done < self.total:
            return f"{self.done:,} of {self.total:,} restored (the others when asked for)"
        if self.finished:
            return f"{self.done:,} restored"
        if self.total is None:
            return "restoring"
        return f"restoring: {self.done:,} of {self.total:,} (a stream asked for is restored first)"


class LiveStreams:
    """Every known stream's live state and lock. Nothing is allocated for a stream id before
    the database says the stream exists; `forget` frees what a deleted stream held."""

    def __init__(
        self,
        database: Database,
        registry: ModelRegistry,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        retention: timedelta | None = None,
        store: ArtifactStore | None = None,
        follower: bool = False,
        relearning: bool = False,
        retired_kept: int = catalogue.RETIRED_KEPT,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self.database = database
        self.registry = registry
        self.checkpoint_every = checkpoint_every
        # Readings older than this (by the stream's own clock) are removed at its checkpoints,
        # never one a restart would replay; None keeps them all.
        self.retention = retention
        self.store = store  # where the versions streams learn keep their artifacts
        # An API process on the bus processes no reading: each read restores the stream from
        # what the workers committed (its checkpoint and the readings after it).
        self.follower = follower
        # Learned streams learn again on their history (app/learning/relearn.py).
        self.relearning = relearning
        self.retired_kept = retired_kept  # a learned stream's versions kept once retired
        self._slots: dict[str, Slot] = {}
        self._guard = threading.Lock()
        self.kinds = Kinds(registry, max_gap)  # what processes each stream
        # Called (after the commit) when a learning stream has all its learning readings.
        self.on_learning_due: Callable[[str], object] | None = None
        # On the bus, a worker's: called first in a transaction that writes a stream's state on
        # its own initiative (a fit adopted, a revision, a stale alarm); False if the worker no
        # longer holds the stream's partition, and nothing is written.
        self.owns: Callable[[Session, str], bool] | None = None

    # -- holding streams --

    def hold(self, session: Session, stream_ids: Sequence[str]) -> list[LiveStream]:
        """The streams' live states, restored on first touch, held by `session` until its
        transaction ends: no other request touches them meanwhile, and a stream restored here is
        remembered only if the transaction commits. NotFoundError for an unknown stream."""
        pending = pending_of(session)
        wanted = sorted(set(stream_ids) - set(pending.held))
        while True:
            slots = self._slots_of(session, wanted)
            for stream_id in wanted:
                slots[stream_id].lock.acquire()
            with self._guard:
                stale = [i for i in wanted if self._slots.get(i) is not slots[i]]
            if not stale:
                break
            for stream_id in wanted:  # a stream was deleted meanwhile: look again
                slots[stream_id].lock.release()
        pending.held.update(slots)
        unrestored = [
            stream_id
            for stream_id in dict.fromkeys(stream_ids)
            if pending.held[stream_id].live is None and stream_id not in pending.restored
        ]
        for stream_id, (live, _) in self.restore(session, unrestored).items():
            pending.restored[stream_id] = live
        return [pending.held[i].live or pending.restored[i] for i in stream_ids]

    def on_end(
        self,
        session: Session,
        *,
        commit: Callable[[], None] | None = None,
        rollback: Callable[[], None] | None = None,
    ) -> None:
        """Run `commit` once `session`'s transaction has committed, `rollback` if it did not,
        before the streams it holds are released."""
        pending = pending_of(session)
        if commit is not None:
            pending.on_commit.append(commit)
        if rollback is not None:
            pending.on_rollback.append(rollback)

    def _slots_of(self, session: Session, stream_ids: Sequence[str]) -> dict[str, Slot]:
        with self._guard:
            known = {i: self._slots[i] for i in stream_ids if i in self._slots}
        missing = [i for i in stream_ids if i not in known]
        if missing:
            stream_repo.require_existing(session, missing)  # NotFoundError before allocating
            with self._guard:
                for stream_id in missing:
                    known[stream_id] = self._slots.setdefault(stream_id, Slot())
        return known

    def restore(
        self, session: Session, stream_ids: Sequence[str], *, events_from: int | None = None
    ) -> dict[str, tuple[LiveStream, Replayed]]:
        """The streams' states from their checkpoints and the readings stored after them, and
        the events each replay raised from sample `events_from` on (none without it). Read
        `RESTORED_TOGETHER` streams at a time: a start-up or a gateway's tick restores many."""
        restored = {}
        for start in range(0, len(stream_ids), RESTORED_TOGETHER):
            chunk = stream_ids[start : start + RESTORED_TOGETHER]
            streams = stream_repo.require_many(session, chunk)
            checkpoints = checkpoint_repo.get_many(session, chunk)
            learned = learned_repo.get_many(
                session, [stream.id for stream in streams if stream.model_name == AUTO]
            )
            stored = reading_repo.batches_after_checkpoints(session, chunk)
            stale_since = {
                row.stream_id: row.opened_sample
                for row in alarm_repo.list_open(session, stream_ids=chunk)
                if row.detector == "stale"
            }
            made = []
            together: dict[tuple[int, bool], list[tuple[Recurrence, StreamState, Readings, float]]]
            together = {}
            for stream in streams:
                kind = self.kinds.of(stream, learned.get(stream.id))
                state, due, readings = self._resumed(
                    stream, kind, checkpoints.get(stream.id), stored.get(stream.id, [])
                )
                replayed = Replayed()
                plain = kind.base is None and kind.quiet_until is None and not kind.revisions
                if readings is not None and plain and events_from is None:
                    key = (id(kind.recurrence), stream.has_reference)
                    item = (kind.recurrence, state, readings, kind.sample_period_s)
                    together.setdefault(key, []).append(item)
                elif readings is not None:
                    replayed = replay(
                        kind.recurrence if kind.base is None else kind.base,
                        state,
                        readings,
                        kind.sample_period_s,
                        quiet_until=kind.quiet_until,
                        events_from=events_from,
                        revisions=kind.revisions,
                    )
                made.append((stream, kind, state, due, replayed))
            for group in together.values():
                _advance_together(group)
            for stream, kind, state, due, replayed in made:
                checkpoint = checkpoints.get(stream.id)
                saved = None if checkpoint is None else checkpoint.sample_count
                live = self._live(
                    session, stream, kind, state, due, stale_since.get(stream.id), saved
                )
                restored[stream.id] = (live, replayed)
        return restored

    def _resumed(
        self,
        stream: Stream,
        kind: Kind,
        checkpoint: StreamCheckpoint | None,
        stored: list[reading_repo.StoredBatch],
    ) -> tuple[StreamState, int, Readings | None]:
        """One stream's state from its checkpoint (a new one without), when its next checkpoint
        is due, and the readings stored after the checkpoint, still to run through it."""
        recurrence = kind.recurrence
        if checkpoint is None:
            state = recurrence.new_state()
        else:
            if checkpoint.state_version not in READABLE_STATE_VERSIONS:
                raise DataError(f"stream {stream.id!r} has a checkpoint of another version")
            saved = checkpoint.state
            last_time = None if checkpoint.last_t is None else reading_repo.micro(checkpoint.last_t)
            try:
                state = recurrence.restore(saved, last_time)
            except DataError:
                # The detectors were reconfigured since: they start afresh from this reading.
                state = recurrence.restore(saved, last_time, fresh_monitor=True)
        due = self.next_checkpoint(stream.id, state.samples)
        stored = [batch for batch in stored if batch.first_sample >= state.samples]
        if not stored:
            return state, due, None
        expected = state.samples
        for batch in stored:
            if batch.first_sample != expected:
                raise DataError(
                    f"stream {stream.id!r}: readings from sample {expected} are missing"
                )
            expected = batch.stop
        return state, due, joined(stored, has_reference=stream.has_reference)

    def _live(
        self,
        session: Session,
        stream: Stream,
        kind: Kind,
        state: StreamState,
        due: int,
        stale_since: int | None,
        saved: int | None,
    ) -> LiveStream:
        recurrence = kind.recurrence
        live = LiveStream(
            stream_id=stream.id,
            model_name=kind.name or stream.model_name,
            model_version=kind.version,
            channels=list(stream.channels),
            has_reference=stream.has_reference,
            sample_period_s=kind.sample_period_s,
            recurrence=recurrence,
            state=state,
            checkpoint_due=due,
            saved_samples=saved,
            open_peaks={e.detector: e.peak for e in recurrence.monitor.open_events(state.monitor)},
            learning=kind.learning,
            learned=kind.learned,
            revised_from=kind.revisions[-1][0] if kind.revisions else (kind.quiet_until or 0),
            relearn_at=kind.relearn_at,
            prove_at=kind.prove_at,
            stale_since=stale_since,
        )
        if kind.learning is not None:
            times = reading_repo.all_times(session, stream_id=stream.id)
            kind.learning.first_time = int(times[0]) if times.size else None
            kind.learning.end = kind.learning.plan.end(times)
        return live

    # -- what changes a stream --

    def forget(self, stream_id: str) -> None:
        """Drop the stream's live state: it is restored from the database on its next touch."""
        with self._guard:
            slot = self._slots.get(stream_id)
        if slot is not None:
            slot.live = None

    def delete(self, session: Session, stream_id: str) -> None:
        """Hold the stream while `session` deletes it; once committed, free what it held."""
        self.hold(session, [stream_id])

        def drop() -> None:
            with self._guard:
                self._slots.pop(stream_id, None)

        self.on_end(session, commit=drop)

    def reconfigure(self, session: Session, stream_id: str) -> None:
        """Call before a stream's configuration changes in `session`: its state is checkpointed
        there (so nothing is ever replayed under a configuration its readings were not processed
        with) and restored under the new configuration on its next touch."""
        self.refuse_on_the_bus(session, stream_id, "changing its configuration")
        live = self.hold(session, [stream_id])[0]
        if live.state.samples:
            self.checkpoint(session, live, force=False)
        pending = pending_of(session)
        pending.restored.pop(stream_id, None)
        pending.held[stream_id].live = None

    def refuse_on_the_bus(self, session: Session, stream_id: str, change: str) -> None:
        """On the bus a stream's state is its worker's, and so are its changes: an API process
        publishes them to the worker (`app/api/changes.py`). One that reaches this far in an
        API process is a bug, refused before it can race the worker."""
        if self.follower and reading_repo.any_for(session, stream_id=stream_id):
            raise RuntimeError(
                f"{change} of stream {stream_id!r} in an API process on the bus: its worker "
                "makes it (app/api/changes.py)"
            )

    def revision_due(self, live: LiveStream) -> bool:
        """Whether a learned stream has seen enough readings since its thresholds were last
        fitted to fit them again (app/learning/adapt.py), with no alarm open: thresholds are
        fitted again in normal operation, never in the middle of a fault."""
        learned = live.learned
        return (
            learned is not None
            and not live.open_peaks
            and live.state.samples >= next_revision(learned, live.revised_from)
        )

    @staticmethod
    def relearning_due(live: LiveStream) -> bool:
        """Whether a learned stream's readings have reached the time it learns again, or the
        time its relearned candidate is decided on with no alarm open (app/learning/
        relearn.py)."""
        last = live.state.last_time
        if last is None:
            return False
        return (live.relearn_at is not None and last >= live.relearn_at) or (
            live.prove_at is not None and last >= live.prove_at and not live.open_peaks
        )

    def name_of(self, stream: Stream) -> str:
        """The name a stream's alarms give its model."""
        return learned_name(stream.id) if stream.model_name == AUTO else stream.model_name

    def version_of(self, session: Session, stream: Stream) -> str:
        """The version a stream runs: the one it names, else its model's active one."""
        version = version_repo.run_by(session, stream)
        return "unknown" if version is None else str(version)

    def next_checkpoint(self, stream_id: str, samples: int) -> int:
        """The reading count at which a stream that has seen `samples` writes its next
        checkpoint: every `checkpoint_every` readings, at a phase of its own. Streams fed
        together (a gateway's ticks, a restart's checkpoints) would otherwise all come due on
        the same request and hold it up while it writes them all."""
        phase = zlib.crc32(stream_id.encode()) % self.checkpoint_every
        return samples + 1 + (phase - samples - 1) % self.checkpoint_every

    def checkpoint(self, session: Session, live: LiveStream, *, force: bool) -> bool:
        """Write the stream's state (and its row's reading count), unless `force` is False and
        it is saved already, then tidy the readings the checkpoint leaves behind (small rows
        packed, old ones pruned). Call it holding the stream."""
        if self.follower:
            return False  # the workers own the streams' checkpoints
        state = live.state
        if not self._save(session, [live], force=force):
            return False
        reading_repo.pack(session, stream_id=live.stream_id, before_sample=state.samples)
        if self.retention is not None and live.learning is None and state.last_time is not None:
            # A learning stream keeps every reading: its fit reads them all.
            reading_repo.prune(
                session,
                stream_id=live.stream_id,
                before_sample=state.samples,
                before=reading_repo.datetime_at(state.last_time) - self.retention,
            )
        return True

    def _save(self, session: Session, lives: Sequence[LiveStream], *, force: bool) -> int:
        """Write the states of those of the streams that moved since their checkpoint (all of
        them with `force`) and their rows' reading counts, in one statement each. A stream is
        known to be saved once the transaction commits. Returns how many were written."""
        moved = [live for live in lives if force or live.saved_samples != live.state.samples]
        if not moved:
            return 0
        rows = [
            checkpoint_repo.Saved(
                stream_id=live.stream_id,
                sample_count=live.state.samples,
                last_t=None
                if live.state.last_time is None
                else reading_repo.datetime_at(live.state.last_time),
                state=live.state.to_bytes(live.recurrence.monitor),
                state_version=STATE_VERSION,
            )
            for live in moved
        ]
        checkpoint_repo.save(session, rows, now=datetime.now(UTC))
        stream_repo.advance_many(
            session, [(row.stream_id, row.sample_count, row.last_t) for row in rows]
        )

        def saved() -> None:
            for live, row in zip(moved, rows, strict=True):
                live.saved_samples = row.sample_count

        self.on_end(session, commit=saved)
        return len(moved)

    def checkpoint_all(self) -> int:
        """Checkpoint every live stream that moved since its last checkpoint (at shutdown: the
        next start replays nothing), `SAVED_TOGETHER` streams a transaction. The readings'
        tidying is left to each stream's next checkpoint. Returns how many were written."""
        if self.follower:
            return 0  # the workers own the streams' checkpoints
        with self._guard:
            ids = [
                stream_id
                for stream_id, slot in self._slots.items()
                if slot.live is not None and slot.live.saved_samples != slot.live.state.samples
            ]
        written = 0
        for start in range(0, len(ids), SAVED_TOGETHER):
            with self.database.session() as session:
                chunk = [
                    stream_id
                    for stream_id in ids[start : start + SAVED_TOGETHER]
                    if (slot := self._slots.get(stream_id)) is not None and slot.live is not None
                    if self.owns is None or self.owns(session, stream_id)
                ]  # (another worker's stream is that one's to write)
                lives = self.hold(session, chunk)
                written += self._save(session, lives, force=False)
                for live in lives:
                    live.checkpoint_due = self.next_checkpoint(live.stream_id, live.state.samples)
        return written

    def restore_all(
        self, only: Callable[[str], bool] | None = None, progress: Restoring | None = None
    ) -> list[tuple[str, str]]:
        """Restore every stream (`only` those it accepts: a bus worker's partition), at
        start-up, so every stream's metric series exist from the first scrape and a silent
        one is seen to be; `progress` follows it (and may stop it). A stream a request needs
        meanwhile is restored by the request (`hold`): the two take its lock in turn. Returns
        the streams that cannot be restored, with why."""
        problems = []
        with self.database.session() as session:
            ids = stream_repo.all_ids(session)
        if only is not None:
            ids = [stream_id for stream_id in ids if only(stream_id)]
        if progress is not None:
            progress.total = len(ids)
        for start in range(0, len(ids), RESTORED_TOGETHER):
            if progress is not None and progress.stop.is_set():
                break
            chunk = ids[start : start + RESTORED_TOGETHER]
            try:
                with self.database.session() as session:
                    lives = self.hold(session, chunk)
            except (DataError, ArtifactError):  # one by one, to say which cannot
                lives = []
                for stream_id in chunk:
                    try:
                        with self.database.session() as session:
                            lives += self.hold(session, [stream_id])
                    except (DataError, ArtifactError) as exc:
                        problems.append((stream_id, exc.detail))
            for live in lives:
                self.learn_if_due(live)
            if progress is not None:
                progress.done += len(chunk)
        return problems

    def learn_if_due(self, live: LiveStream) -> None:
        """Ask for the stream's fit if it has all its learning readings (and no failed fit of
        them: that one waits for a reconfiguration), or for its thresholds' revision, its
        relearning or its candidate's verdict if one is due."""
        learning = live.learning
        if learning is None:
            due = self.revision_due(live) or self.relearning_due(live)
        else:
            due = learning.end is not None
        if due and (learning is None or learning.error is None) and self.on_learning_due:
            self.on_learning_due(live.stream_id)

    # -- reads --

    def read(self, session: Session, stream: Stream) -> LiveStream:
        """The stream's live state for a read: held until `session` ends."""
        if self.follower:
            self.forget(stream.id)
        return self.hold(session, [stream.id])[0]

    def model_of(self, session: Session, stream: Stream) -> tuple[Recurrence, float, str]:
        """What the stream runs now (its recurrence, sample period and model version), read
        without holding it."""
        kind = self.kinds.of(stream, learned_repo.get(session, stream.id))
        return kind.recurrence, kind.sample_period_s, kind.version

    def peek(self, stream_id: str) -> LiveStream | None:
        """The stream's live state if it is in memory, not held (for a listing's summary)."""
        with self._guard:
            slot = self._slots.get(stream_id)
        return None if slot is None else slot.live

    def position(self, stream_id: str) -> tuple[int, int | None] | None:
        """(readings seen, last time) of a stream in memory; None if it is not."""
        with self._guard:
            slot = self._slots.get(stream_id)
        live = None if slot is None else slot.live
        if live is None:
            return None
        return live.state.samples, live.state.last_time

    def __len__(self) -> int:
        """Streams known here (held, or with a live state)."""
        with self._guard:
            return len(self._slots)

    def live_streams(self) -> list[LiveStream]:
        with self._guard:
            return [slot.live for slot in self._slots.values() if slot.live is not None]


def _advance_together(group: list[tuple[Recurrence, StreamState, Readings, float]]) -> None:
    """Streams of one recurrence through their readings in one block, as a gateway's tick
    runs them: the same bits as one at a time (docs/benchmarks.md: a restart's replay)."""
    recurrence = group[0][0]
    readings = [item[2] for item in group]
    references = [r.references for r in readings if r.references is not None]  # all or none
    recurrence.advance(
        [item[1] for item in group],
        Readings(
            np.array([int(r.counts[0]) for r in readings]),
            np.concatenate([r.times for r in readings]),
            np.concatenate([r.values for r in readings]),
            np.concatenate(references) if references else None,
        ),
        [item[3] for item in group],
    )
