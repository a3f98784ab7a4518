"""The live streams: each stream's state in memory, restored from the database when first touched.

The database holds every accepted reading and, every `checkpoint_every` readings, a checkpoint
of the stream's state. A stream that is not in memory (after a start, a failed transaction or
a reconfiguration) is restored from its checkpoint and the readings stored after it, run through
the same recurrence: since the recurrence gives the same result however readings are grouped,
the restored state is exactly the one the stream had.

One request at a time works on a stream: `hold` takes the streams' locks (in a fixed order, so
two requests never deadlock) and keeps them until the caller's transaction ends. If it rolls
back, the streams it moved are dropped from memory and restored from what was committed.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from app import catalogue
from app.errors import ArtifactError, ConflictError, DataError, NotFoundError
from app.learning.adapt import next_revision
from app.learning.learn import LearnedModel
from app.learning.relearn import RelearnPlan
from app.monitoring.alarms import AlarmEvent
from app.monitoring.monitor import MISSING_READINGS, MonitorConfig
from app.registry import AUTO, ModelRegistry, RegisteredModel, learned_name
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.models import LearnedModel as LearnedModelRow
from app.storage.models import ModelVersion, Stream, StreamCheckpoint
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.learning import Learning, LearningPlan, Replayed, learning_recurrence, replay
from app.streams.recurrence import (
    DEFAULT_MAX_GAP,
    READABLE_STATE_VERSIONS,
    STATE_VERSION,
    Readings,
    Recurrence,
    StreamResult,
    StreamState,
)
from app.streams.shadow import Run
from app.streams.shadow import run as shadow_run

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_EVERY = 1000
"""Readings between two checkpoints of a stream: what a restart replays at most."""

REWARM_READINGS = 2000
"""The stored readings a stream's new model sees (silently) when it switches to it: enough for
its forecaster's context and its detectors' windows to be what they would have been."""

MOST_RECOMPUTED = 1_000_000
"""Readings replayed at once for a read (`GET .../readings`, a shadow's comparison, a proof): a
longer range is asked for in parts."""

RESTORED_TOGETHER = 1000
"""Streams restored from one set of queries (their rows, checkpoints and readings since)."""

SAVED_TOGETHER = 1000
"""Streams whose checkpoints a stop writes in one transaction (one statement each table)."""


def monitor_config(model: RegisteredModel, overrides: dict[str, Any]) -> MonitorConfig:
    """The model's detectors (`model_detectors`) with a stream's overrides applied. Overrides of
    detectors it does not have change nothing here: a PUT refuses them (`refuse_absent_detectors`),
    and a stream stored before it did keeps running."""
    return with_overrides(model_detectors(model), overrides)


def model_detectors(model: RegisteredModel) -> MonitorConfig:
    """The model's calibrated detectors, and the missing-readings rule if its calibration made
    none (it needs no calibration: every stream watches for missing readings)."""
    if not model.thresholds:
        raise ArtifactError(
            f"model {model.name!r} has no detector thresholds: run `twinwatch calibrate` on it"
        )
    base = MonitorConfig.from_manifest(model.manifest)
    if MISSING_READINGS.kind in {detector.kind for detector in base.detectors}:
        return base
    return base.model_copy(update={"detectors": [*base.detectors, MISSING_READINGS]})


def refuse_absent_detectors(model: RegisteredModel, overrides: dict[str, Any]) -> None:
    """A DataError if `overrides` asks something of a detector the model does not have (it
    would be accepted and never raise; switching one off is what it is already)."""
    if not overrides:  # (the common case, a fleet's onboarding: no manifest read)
        return
    kinds = [detector.kind for detector in model_detectors(model).detectors]
    absent = sorted(
        kind
        for kind, override in overrides.items()
        if kind not in kinds and override != {"enabled": False}
    )
    if absent:
        raise DataError(
            f"model {model.name!r} has no detector {', '.join(absent)}: its detectors are "
            f"{', '.join(kinds)}",
            model=model.name,
        )


def with_overrides(base: MonitorConfig, overrides: dict[str, Any]) -> MonitorConfig:
    """Detectors with a stream's overrides applied (switched off, another threshold or alarm
    policy)."""
    detectors = []
    for detector in base.detectors:
        override = overrides.get(detector.kind, {})
        if not override.get("enabled", True):
            continue
        update: dict[str, Any] = {}
        if override.get("threshold") is not None:
            update["threshold"] = float(override["threshold"])
            resting = getattr(detector, "resting", None)
            if resting is not None and resting >= update["threshold"]:
                update["resting"] = None  # (a threshold below the rest closes on itself)
        if override.get("policy") is not None:
            update["alarm"] = override["policy"]
        if not update:
            detectors.append(detector)
            continue
        try:  # (validated as a whole: a copy with an update is not)
            detectors.append(type(detector).model_validate(detector.model_dump() | update))
        except ValidationError as exc:
            raise DataError(f"detector {detector.kind}: {exc.errors()[0]['msg']}") from None
    if not detectors:
        raise DataError("every detector is disabled: the stream would never alarm")
    return base.model_copy(update={"detectors": detectors})


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
class _Slot:
    """A known stream's lock, and its live state once restored."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    live: LiveStream | None = None


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
        self.max_gap = max_gap
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
        self._slots: dict[str, _Slot] = {}
        self._guard = threading.Lock()
        self._recurrences: dict[tuple[str, str, str], Recurrence] = {}
        # Called (after the commit) when a learning stream has all its learning readings.
        self.on_learning_due: Callable[[str], object] | None = None
        # On the bus, a worker's: called first in a transaction that writes a stream's state on
        # its own initiative (a fit adopted, a revision, a stale alarm); False if the worker no
        # longer holds the stream's partition, and nothing is written.
        self.owns: Callable[[Session, str], bool] | None = None

    def recurrence_for(self, model: RegisteredModel, overrides: dict[str, Any]) -> Recurrence:
        """One recurrence per model and detector overrides, shared by every stream configured
        alike. Raises a DataError or ArtifactError if the configuration cannot monitor."""
        key = (model.name, model.version, json.dumps(overrides, sort_keys=True))
        with self._guard:
            recurrence = self._recurrences.get(key)
        if recurrence is None:
            recurrence = Recurrence(
                model.forecaster, monitor_config(model, overrides), max_gap=self.max_gap
            )
            with self._guard:
                recurrence = self._recurrences.setdefault(key, recurrence)
        return recurrence

    # -- holding streams --

    def hold(self, session: Session, stream_ids: Sequence[str]) -> list[LiveStream]:
        """The streams' live states, restored on first touch, held by `session` until its
        transaction ends: no other request touches them meanwhile, and a stream restored here is
        remembered only if the transaction commits. NotFoundError for an unknown stream."""
        pending = _pending(session)
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
        for stream_id, (live, _) in self._restore(session, unrestored).items():
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
        pending = _pending(session)
        if commit is not None:
            pending.on_commit.append(commit)
        if rollback is not None:
            pending.on_rollback.append(rollback)

    def _slots_of(self, session: Session, stream_ids: Sequence[str]) -> dict[str, _Slot]:
        with self._guard:
            known = {i: self._slots[i] for i in stream_ids if i in self._slots}
        missing = [i for i in stream_ids if i not in known]
        if missing:
            stream_repo.require_existing(session, missing)  # NotFoundError before allocating
            with self._guard:
                for stream_id in missing:
                    known[stream_id] = self._slots.setdefault(stream_id, _Slot())
        return known

    def _restore(
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
                kind = self._kind(stream, learned.get(stream.id))
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
        kind: _Kind,
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
        return state, due, _joined(stored, has_reference=stream.has_reference)

    def _live(
        self,
        session: Session,
        stream: Stream,
        kind: _Kind,
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

    def _kind(self, stream: Stream, row: LearnedModelRow | None) -> _Kind:
        """What processes the stream: its named model, its learned one (`row`), or (still
        learning) the learning recurrence."""
        if stream.model_name != AUTO:
            pinned = None if stream.model_version is None else str(stream.model_version)
            model = self.registry.require(stream.model_name, pinned)
            period = stream.sample_period_s if stream.sample_period_s is not None else 0.1
            recurrence = self.recurrence_for(model, stream.detector_overrides)
            return _Kind(recurrence, period, model.version)
        if row is None or row.model is None:
            learning = Learning(
                LearningPlan.of(stream.learning),
                first_time=None,
                error=None if row is None else row.error,
            )
            recurrence = learning_recurrence(len(stream.channels))
            return _Kind(recurrence, math.inf, "learning", learning=learning)
        learned = LearnedModel.from_json(row.model)
        base = self.learned_recurrence(stream, learned)
        revisions = []
        for revision in row.revisions:
            revised = MonitorConfig.model_validate(revision["monitor"])
            recurrence = self.learned_recurrence(stream, replace(learned, monitor=revised))
            revisions.append((int(revision["from_sample"]), recurrence))
        if stream.model_version is not None:
            version = str(stream.model_version)
        else:  # (learned before the catalogue kept learned versions)
            version = f"learned-{row.fitted_at:%Y%m%dT%H%M%SZ}"
        return _Kind(
            revisions[-1][1] if revisions else base,
            learned.sample_period_s,
            version,
            name=learned_name(stream.id),
            learned=learned,
            quiet_until=row.learned_from,
            base=base,
            revisions=revisions,
            relearn_at=None if row.relearn_at is None else reading_repo.micro(row.relearn_at),
            prove_at=None if row.prove_at is None else reading_repo.micro(row.prove_at),
        )

    def learned_recurrence(self, stream: Stream, learned: LearnedModel) -> Recurrence:
        """The recurrence of a model the stream learned, with the stream's detector overrides
        (if it did not get the detectors they leave on: without them, and a warning)."""
        try:
            monitor = with_overrides(learned.monitor, stream.detector_overrides)
        except DataError as exc:
            log.warning("stream %s: its overrides are not applied: %s", stream.id, exc.detail)
            monitor = learned.monitor
        return Recurrence(learned.forecaster, monitor, max_gap=self.max_gap)

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
        self._refuse_on_the_bus(session, stream_id, "changing its configuration")
        live = self.hold(session, [stream_id])[0]
        if live.state.samples:
            self.checkpoint(session, live, force=False)
        pending = _pending(session)
        pending.restored.pop(stream_id, None)
        pending.held[stream_id].live = None

    def _refuse_on_the_bus(self, session: Session, stream_id: str, change: str) -> None:
        """On the bus a stream's state is its worker's, and so are its changes: an API process
        publishes them to the worker (`app/api/changes.py`). One that reaches this far in an
        API process is a bug, refused before it can race the worker."""
        if self.follower and reading_repo.any_for(session, stream_id=stream_id):
            raise RuntimeError(
                f"{change} of stream {stream_id!r} in an API process on the bus: its worker "
                "makes it (app/api/changes.py)"
            )

    def adopt(
        self,
        stream_id: str,
        learned: LearnedModel | None,
        *,
        error: str | None,
        end: int,
        generation: datetime,
        job_id: int | None = None,
    ) -> alarm_repo.Applied | None:
        """Switch a learning stream to what it learned from its first `end` readings, in one
        transaction: the model is stored, every reading is replayed through it (the learning
        readings silently, the later ones raising their alarms, which are stored), the learning
        phase's open alarms close where learning ended, and a checkpoint is written. With no
        model (`error`), the stream keeps learning and says why. Returns what it did to alarm
        rows; None if the stream was reconfigured, deleted or has learned meanwhile. The job
        that fitted it (`job_id`, running) succeeds in the same transaction."""
        with self.database.session() as session:
            if self.owns is not None and not self.owns(session, stream_id):
                return None  # another worker holds it now, and fits it again
            # The stream's lock first, then its row: ingest holds the lock while its inserts
            # need the row, so the other order could deadlock.
            try:
                self.hold(session, [stream_id])  # no request moves it meanwhile
            except NotFoundError:
                return None
            stream = stream_repo.get(session, stream_id, for_update=True)
            if stream is None or stream.model_name != AUTO or stream.updated_at != generation:
                return None
            existing = learned_repo.get(session, stream_id)
            if existing is not None and existing.model is not None:
                return None
            now = datetime.now(UTC)
            saved = learned_repo.save(
                session,
                stream_id=stream_id,
                learned_from=end,
                fitted_at=now,
                model=None if learned is None else learned.to_json(),
                error=error,
            )
            pending = _pending(session)
            pending.restored.pop(stream_id, None)
            pending.held[stream_id].live = None
            if learned is None:
                return alarm_repo.Applied([], [])  # still learning, with its error, next touch
            version = catalogue.first_fit(session, self.store, stream, learned, end, now=now)
            _succeeded(session, job_id, version, now=now)
            saved.history_from = reading_repo.first_time(session, stream_id=stream_id)
            if saved.history_from is not None:
                saved.relearn_at = self.next_relearning(stream, None, saved.history_from)

            # The learning phase's open alarms end where learning ended (their incidents too).
            ending = [
                AlarmEvent(row.detector, row.opened_sample, end, row.peak, row.threshold, end)
                for row in alarm_repo.list_open(session, stream_id=stream_id)
            ]
            checkpoint_repo.delete(session, stream_id)
            live, replayed = self._restore(session, [stream_id], events_from=end)[stream_id]
            open_events = live.recurrence.monitor.open_events(live.state.monitor)
            applied = alarm_repo.apply(
                session,
                stream_id=stream_id,
                opened=replayed.opened,
                closed=ending + replayed.closed,
                peaks={event.detector: event.peak for event in open_events},
                time_of=_times_of(session, stream_id),
                model_name=live.model_name,
                model_version=live.model_version,
                channels=live.channels,
            )
            live.open_peaks = {event.detector: event.peak for event in open_events}
            if live.state.samples:
                self.checkpoint(session, live, force=True)
            live.checkpoint_due = self.next_checkpoint(stream_id, live.state.samples)
            pending.restored[stream_id] = live
        return applied

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

    def next_relearning(
        self, stream: Stream, last_s: float | None, history_from: datetime
    ) -> datetime | None:
        """When, on its readings' clock, a learned stream whose history began at
        `history_from` learns again after a relearning on `last_s` seconds of it (None: after
        its first fit); None: never."""
        plan = RelearnPlan.of(stream.learning) if self.relearning else None
        due = None if plan is None else plan.next_at(last_s)
        return None if due is None else history_from + timedelta(seconds=due)

    def schedule_relearning(self) -> int:
        """Give the learned streams that have no relearning scheduled one by their own
        schedule (those learned before relearning existed, or while it was off). Returns how
        many it scheduled."""
        if not self.relearning:
            return 0
        scheduled = 0
        with self.database.session() as session:
            for stream, row in learned_repo.unscheduled(session):
                if row.history_from is None:
                    row.history_from = reading_repo.first_time(session, stream_id=stream.id)
                if row.history_from is not None:
                    row.relearn_at = self.next_relearning(stream, row.relearned_s, row.history_from)
                    scheduled += row.relearn_at is not None
        return scheduled

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

    def adopt_revision(
        self,
        stream_id: str,
        monitor: MonitorConfig,
        *,
        fitted_at: datetime,
        revisions: int,
        job_id: int | None = None,
    ) -> bool:
        """Revised thresholds for a learned stream, from its next reading on: the next version
        of its learned models (the job that revised them, `job_id`, succeeds with it). False if
        it learned again or was revised meanwhile (`fitted_at`, `revisions`: what the revision
        was computed from), or if an alarm opened meanwhile: thresholds are never revised in
        the middle of a fault (it is revised once the alarm has closed)."""
        with self.database.session() as session:
            if self.owns is not None and not self.owns(session, stream_id):
                return False  # another worker holds it now, and revises it again
            try:
                live = self.hold(session, [stream_id])[0]
            except NotFoundError:
                return False
            if live.open_peaks:
                return False
            row = learned_repo.get(session, stream_id)
            if row is None or row.fitted_at != fitted_at or len(row.revisions) != revisions:
                return False
            assert row.model is not None
            learned_repo.add_revision(
                session,
                row,
                from_sample=live.state.samples,
                monitor=monitor.model_dump(mode="json"),
            )
            stream = stream_repo.require(session, stream_id)
            now = datetime.now(UTC)
            learned = LearnedModel.from_json(row.model)
            version = catalogue.revision(
                session, self.store, stream, learned, monitor, live.state.samples, now=now
            )
            _succeeded(session, job_id, version, now=now)
            self.prune_versions(session, stream_id)
            if live.state.samples:
                self.checkpoint(session, live, force=False)
            pending = _pending(session)
            pending.restored.pop(stream_id, None)
            pending.held[stream_id].live = None
            pending.restored[stream_id] = self._restore(session, [stream_id])[stream_id][0]
        return True

    def prune_versions(self, session: Session, stream_id: str) -> None:
        """Delete a learned stream's retired versions beyond the newest `retired_kept` (never
        its rollback target or its shadow), in `session`'s transaction; their artifacts are
        removed once it has committed."""
        name = learned_name(stream_id)
        switch = version_repo.last_switch(session, stream_id)
        keep = set()
        if switch is not None and switch.from_model == name and switch.from_version.isdigit():
            keep.add(int(switch.from_version))
        shadow = version_repo.shadow_of(session, stream_id)
        if shadow is not None and shadow.model_name == name:
            keep.add(shadow.model_version)
        shas = catalogue.prune(session, name, kept=self.retired_kept, keep=keep)
        store = self.store
        if shas and store is not None:

            def removed() -> None:
                for sha in shas:
                    store.remove(sha)

            self.on_end(session, commit=removed)

    def learned_target(self, row: ModelVersion) -> Target:
        """A version of a stream's learned models, loaded, to run or shadow it."""
        return Target(row.name, str(row.version), learned=catalogue.load_learned(self.store, row))

    def runnable(self, stream: Stream, model: RegisteredModel) -> Recurrence:
        """The recurrence of `model` for the stream, refused (ConflictError, DataError) if the
        stream cannot run it: one that learns its own, or one of other channels."""
        if stream.model_name == AUTO:
            raise ConflictError(
                f"stream {stream.id!r} learns its own model: it runs only the versions of "
                f"{learned_name(stream.id)!r}, not a trained model",
                stream=stream.id,
            )
        if model.forecaster.n_channels != len(stream.channels):
            raise DataError(
                f"model {model.name!r} takes {model.forecaster.n_channels} channel(s), stream "
                f"{stream.id!r} has {len(stream.channels)}",
                model=model.name,
            )
        return self.recurrence_for(model, stream.detector_overrides)

    def target_recurrence(self, stream: Stream, target: Target) -> Recurrence:
        """The recurrence of `target` for the stream, refused (ConflictError, DataError) if the
        stream cannot run it: a stream of model "auto" runs only what it learned, any other a
        trained model of as many channels."""
        if target.learned is None:
            assert target.model is not None
            return self.runnable(stream, target.model)
        if stream.model_name != AUTO or target.name != learned_name(stream.id):
            raise ConflictError(
                f"model {target.name!r} is what another stream learned: only that stream runs it",
                stream=stream.id,
                model=target.name,
            )
        return self.learned_recurrence(stream, target.learned)

    def switch(
        self, session: Session, stream_id: str, target: Target, *, reason: str | None = None
    ) -> Switched:
        """Run the stream on `target` (a version of its model or of another with as many
        channels; a learned stream: a version of its learned models) from its next reading on,
        in `session`'s transaction. The new model is warmed on the last `REWARM_READINGS`
        stored readings, silently; the old model's open alarms close at the switch; a
        checkpoint of the new state is written, so a restart continues from it. Holding the
        stream, no reading is processed twice or skipped meanwhile."""
        self._refuse_on_the_bus(session, stream_id, "switching its model")
        try:
            live: LiveStream | None = self.hold(session, [stream_id])[0]
        except (ArtifactError, DataError):  # what it runs cannot: it can still be switched off
            live = None  # (held all the same: `hold` took its lock before restoring it)
        stream = stream_repo.require(session, stream_id, for_update=True)
        recurrence = self.target_recurrence(stream, target)  # (its configuration, locked)
        if live is not None and live.learning is not None:
            raise ConflictError(f"stream {stream_id!r} is still learning", stream=stream_id)
        if live is not None:
            samples, last_time = live.state.samples, live.state.last_time
            previous = (live.model_name, live.model_version)
        else:
            samples = reading_repo.count(session, stream_id=stream_id)
            last = reading_repo.time_of(session, stream_id=stream_id, sample=samples - 1)
            last_time = None if last is None else reading_repo.micro(last)
            previous = (self.name_of(stream), self._version_of(session, stream))
        if previous == (target.name, target.version):
            raise ConflictError(
                f"stream {stream_id!r} runs {target.name} version {target.version} already",
                stream=stream_id,
            )
        if target.learned is not None:
            period = target.learned.sample_period_s
        else:
            period = stream.sample_period_s if stream.sample_period_s is not None else 0.1
        stored = self.stored_range(session, stream, samples, samples, most=0)
        if stored is None:
            state = recurrence.new_state()
            state.samples = samples
        else:
            state = recurrence.quietly(stored.readings, period, start=stored.start)
        state.last_time = last_time
        ending = [
            AlarmEvent(row.detector, row.opened_sample, samples, row.peak, row.threshold, samples)
            for row in alarm_repo.list_open(session, stream_id=stream_id)
            if row.detector != "stale"
        ]
        applied = alarm_repo.apply(
            session,
            stream_id=stream_id,
            opened=[],
            closed=ending,
            peaks={},
            time_of=_times_of(session, stream_id),
            model_name=previous[0],
            model_version=previous[1],
            channels=list(stream.channels),
        )
        now = datetime.now(UTC)
        if target.learned is not None:
            # Its thresholds are revised from here on, on the readings that follow.
            learned_repo.save(
                session,
                stream_id=stream_id,
                learned_from=samples,
                fitted_at=now,
                model=target.learned.to_json(),
            )
            catalogue.activate(session, version_repo.require(session, *target.key))
        else:
            stream.model_name = target.name
        stream.model_version = int(target.version)
        version_repo.record_switch(
            session,
            stream_id=stream_id,
            at_sample=samples,
            previous=previous,
            model=target.key,
            now=now,
            reason=reason,
        )
        switched = LiveStream(
            stream_id=stream_id,
            model_name=target.name,
            model_version=target.version,
            channels=list(stream.channels),
            has_reference=stream.has_reference,
            sample_period_s=period,
            recurrence=recurrence,
            state=state,
            checkpoint_due=self.next_checkpoint(stream_id, samples),
            saved_samples=None,  # (written below)
        )
        self.checkpoint(session, switched, force=True)
        pending = _pending(session)
        pending.held[stream_id].live = None
        pending.restored[stream_id] = self._restore(session, [stream_id])[stream_id][0]
        return Switched(previous, applied)

    def name_of(self, stream: Stream) -> str:
        """The name a stream's alarms give its model."""
        return learned_name(stream.id) if stream.model_name == AUTO else stream.model_name

    def _version_of(self, session: Session, stream: Stream) -> str:
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

    def history(
        self,
        session: Session,
        stream: Stream,
        since: datetime | None,
        until: datetime | None,
        *,
        most: int,
    ) -> History:
        """The stream's stored readings taken in [since, until), with the forecasts, residuals
        and statistics of its current model and thresholds, recomputed: the model first runs
        through up to `REWARM_READINGS` readings before `since` (their statistics and events
        are not part of the answer). A DataError if the range holds more than `most`
        readings. Reads without holding the stream: ingest goes on meanwhile."""
        recurrence, period, version = self.model_of(session, stream)
        nothing = History(recurrence, version, np.empty(0, np.int64), None)
        first = 0
        if since is not None:
            found = reading_repo.sample_at_or_after(session, stream_id=stream.id, t=since)
            if found is None:
                return nothing
            first = found
        stop = None
        if until is not None:
            stop = reading_repo.sample_at_or_after(session, stream_id=stream.id, t=until)
        stored = self.stored_range(session, stream, first, stop, most=most)
        if stored is None:
            return nothing
        state = recurrence.new_state()
        state.samples = stored.start
        period = period if math.isfinite(period) else 1.0  # (learning: no gap restarts it)
        result = recurrence.advance([state], stored.readings, [period]).stream(0)
        times = stored.readings.times[stored.skip :]
        return History(recurrence, version, times, result, stored.skip, stored.readings)

    def model_of(self, session: Session, stream: Stream) -> tuple[Recurrence, float, str]:
        """What the stream runs now (its recurrence, sample period and model version), read
        without holding it."""
        kind = self._kind(stream, learned_repo.get(session, stream.id))
        return kind.recurrence, kind.sample_period_s, kind.version

    def stored_range(
        self, session: Session, stream: Stream, first: int, stop: int | None, *, most: int
    ) -> StoredRange | None:
        """The stream's stored readings from sample `first` to `stop` (by default its last),
        with up to `REWARM_READINGS` before them to warm a model on; None if there are none.
        A DataError, before anything is read, if the range holds more than `most` readings."""
        last = reading_repo.count(session, stream_id=stream.id)
        end = last if stop is None else min(stop, last)
        if end - first > most:
            raise DataError(
                f"the range holds {end - first} readings; at most {most} are recomputed at once: "
                "ask for a shorter range"
            )
        batches = reading_repo.batches_covering(
            session, stream_id=stream.id, first_sample=max(0, first - REWARM_READINGS), stop=end
        )
        if not batches:
            return None
        start = max(batches[0].first_sample, first - REWARM_READINGS)
        readings = _joined(batches, has_reference=stream.has_reference, first=start)
        count = max(0, min(readings.times.shape[0], end - start))
        readings = Readings(
            np.array([count]),
            readings.times[:count],
            readings.values[:count],
            None if readings.references is None else readings.references[:count],
        )
        return StoredRange(start, min(count, max(0, first - start)), readings)

    def shadowed(
        self, session: Session, stream: Stream, from_sample: int, candidate: Recurrence
    ) -> Shadowed:
        """What the stream runs and `candidate`, each over its stored readings since
        `from_sample` (the latest `MOST_RECOMPUTED` at most), each warmed on the readings
        before: what a shadow's comparison and a relearned candidate's proof read."""
        active, period, version = self.model_of(session, stream)
        total = reading_repo.count(session, stream_id=stream.id)  # (not holding the stream)
        first = max(from_sample, total - MOST_RECOMPUTED)
        stored = self.stored_range(session, stream, first, None, most=MOST_RECOMPUTED)
        if stored is None or int(stored.readings.counts[0]) <= stored.skip:
            return Shadowed(version, None, None, None)
        running, shadow = (
            shadow_run(recurrence, stored.readings, period, start=stored.start, skip=stored.skip)
            for recurrence in (active, candidate)
        )
        return Shadowed(version, stored, running, shadow)

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


@dataclass(frozen=True)
class StoredRange:
    """Stored readings of one stream from sample `start`: the first `skip` warm a model up,
    the rest are the range asked for."""

    start: int
    skip: int
    readings: Readings


@dataclass(frozen=True)
class History:
    """What `LiveStreams.history` recomputed: the readings' times from the range's first,
    and the replay's result (which begins `skip` readings earlier, in the warm-up)."""

    recurrence: Recurrence
    version: str
    times: np.ndarray
    result: StreamResult | None
    skip: int = 0
    readings: Readings | None = None

    def column(self, values: np.ndarray) -> np.ndarray:
        """A per-reading column of the replay, from the range's first reading."""
        return values[self.skip :]


@dataclass(frozen=True)
class Switched:
    """What `LiveStreams.switch` did: the model (name, version) the stream ran before, and the
    alarm rows the switch closed."""

    previous: tuple[str, str]
    applied: alarm_repo.Applied


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


def _joined(
    batches: Sequence[reading_repo.StoredBatch], *, has_reference: bool, first: int | None = None
) -> Readings:
    """One stream's consecutive stored batches as one block of readings, from sample `first`
    (by default the first batch's first)."""
    cut = 0 if first is None else first - batches[0].first_sample
    times = np.concatenate([batch.micros for batch in batches])[cut:]
    references = None
    if has_reference:
        references = np.concatenate([batch.references_or_nan for batch in batches])[cut:]
    return Readings(
        np.array([times.shape[0]]),
        times,
        np.concatenate([batch.values for batch in batches])[cut:],
        references,
    )


def _times_of(session: Session, stream_id: str) -> Callable[[int], datetime]:
    """The time of a stream's reading by its sample number; a sample not read yet (an alarm
    that ends where the stream's readings do) takes its last reading's time."""

    def time_of(sample: int) -> datetime:
        stored = reading_repo.time_of(session, stream_id=stream_id, sample=sample)
        if stored is None:
            stored = reading_repo.time_of(session, stream_id=stream_id, sample=sample - 1)
        if stored is None:
            raise ConflictError(f"stream {stream_id!r} has no reading {sample}")
        return stored

    return time_of


def _succeeded(
    session: Session, job_id: int | None, version: ModelVersion, *, now: datetime
) -> None:
    """A learner's job made `version` (in the transaction that made it)."""
    if job_id is not None:
        job_repo.move(
            session,
            job_id,
            to="succeeded",
            when="running",
            result={"name": version.name, "version": version.version},
            finished_at=now,
        )


@dataclass(frozen=True)
class Shadowed:
    """A stream's model (`version`) and a candidate over the same stored readings (None: there
    were none)."""

    version: str
    stored: StoredRange | None
    running: Run | None
    candidate: Run | None


@dataclass(frozen=True)
class Target:
    """A version a stream may run or be shadowed by: a trained model's (`model`), or one of
    the models a stream learned (`learned`)."""

    name: str
    version: str
    model: RegisteredModel | None = None
    learned: LearnedModel | None = None

    @classmethod
    def trained(cls, model: RegisteredModel) -> Target:
        return cls(model.name, model.version, model=model)

    @property
    def key(self) -> tuple[str, int]:
        return self.name, int(self.version)


@dataclass
class _Kind:
    """What processes a stream (see `LiveStreams._kind`)."""

    recurrence: Recurrence  # the one its next readings go through
    sample_period_s: float
    version: str
    name: str | None = None  # what its alarms name the model (by default the stream's model)
    learning: Learning | None = None
    learned: LearnedModel | None = None
    quiet_until: int | None = None  # a learned stream's learning readings: no alarm before
    base: Recurrence | None = None  # a revised stream's recurrence before its first revision
    revisions: list[tuple[int, Recurrence]] = field(default_factory=list)
    relearn_at: int | None = None
    prove_at: int | None = None


@dataclass
class _Pending:
    """What a session holds until its transaction ends: streams (their slots, locked), the
    streams it restored (remembered if it commits) and callbacks."""

    held: dict[str, _Slot] = field(default_factory=dict)
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


def _pending(session: Session) -> _Pending:
    pending = session.info.get(_PENDING)
    if not isinstance(pending, _Pending):
        if not session.in_transaction():
            session.begin()  # (no SQL yet: its end is what releases what it holds)
        pending = session.info[_PENDING] = _Pending()
    return pending


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    pending = session.info.get(_PENDING)
    if isinstance(pending, _Pending):
        pending.committed = True


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return  # a nested transaction
    pending = session.info.pop(_PENDING, None)
    if isinstance(pending, _Pending):
        pending.end()
