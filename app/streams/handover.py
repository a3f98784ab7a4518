"""What a live stream runs, changed in a transaction that holds it: a learning stream's fit
adopted, a learned stream's revised thresholds, a switch to another version (an operator's, a
promotion, a roll-back), and when a learned stream learns again. Each replays or warms the
stream as it would have run, closes what the old model had open, and writes a checkpoint, so
a restart continues from the change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from app import catalogue
from app.errors import ArtifactError, ConflictError, DataError, NotFoundError
from app.learning.learn import LearnedModel
from app.learning.relearn import RelearnPlan
from app.monitoring.alarms import AlarmEvent
from app.monitoring.config import MonitorConfig
from app.registry import AUTO, RegisteredModel, learned_name
from app.storage.models import ModelVersion, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import checkpoints as checkpoint_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.held import LiveStream, pending_of
from app.streams.live import LiveStreams
from app.streams.recomputed import stored_range
from app.streams.recurrence import Recurrence


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


def learned_target(streams: LiveStreams, row: ModelVersion) -> Target:
    """A version of a stream's learned models, loaded, to run or shadow it."""
    return Target(row.name, str(row.version), learned=catalogue.load_learned(streams.store, row))


def runnable(streams: LiveStreams, stream: Stream, model: RegisteredModel) -> Recurrence:
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
    return streams.kinds.recurrence_for(model, stream.detector_overrides)


def target_recurrence(streams: LiveStreams, stream: Stream, target: Target) -> Recurrence:
    """The recurrence of `target` for the stream, refused (ConflictError, DataError) if the
    stream cannot run it: a stream of model "auto" runs only what it learned, any other a
    trained model of as many channels."""
    if target.learned is None:
        assert target.model is not None
        return runnable(streams, stream, target.model)
    if stream.model_name != AUTO or target.name != learned_name(stream.id):
        raise ConflictError(
            f"model {target.name!r} is what another stream learned: only that stream runs it",
            stream=stream.id,
            model=target.name,
        )
    return streams.kinds.learned_recurrence(stream, target.learned)


@dataclass(frozen=True)
class Switched:
    """What `switch` did: the model (name, version) the stream ran before, and the
    alarm rows the switch closed."""

    previous: tuple[str, str]
    applied: alarm_repo.Applied


def switch(
    streams: LiveStreams,
    session: Session,
    stream_id: str,
    target: Target,
    *,
    reason: str | None = None,
) -> Switched:
    """Run the stream on `target` (a version of its model or of another with as many
    channels; a learned stream: a version of its learned models) from its next reading on,
    in `session`'s transaction. The new model is warmed on the last `REWARM_READINGS`
    stored readings, silently; the old model's open alarms close at the switch; a
    checkpoint of the new state is written, so a restart continues from it. Holding the
    stream, no reading is processed twice or skipped meanwhile."""
    streams.refuse_on_the_bus(session, stream_id, "switching its model")
    try:
        live: LiveStream | None = streams.hold(session, [stream_id])[0]
    except (ArtifactError, DataError):  # what it runs cannot: it can still be switched off
        live = None  # (held all the same: `hold` took its lock before restoring it)
    stream = stream_repo.require(session, stream_id, for_update=True)
    recurrence = target_recurrence(streams, stream, target)  # (its configuration, locked)
    if live is not None and live.learning is not None:
        raise ConflictError(f"stream {stream_id!r} is still learning", stream=stream_id)
    if live is not None:
        samples, last_time = live.state.samples, live.state.last_time
        previous = (live.model_name, live.model_version)
    else:
        samples = reading_repo.count(session, stream_id=stream_id)
        last = reading_repo.time_of(session, stream_id=stream_id, sample=samples - 1)
        last_time = None if last is None else reading_repo.micro(last)
        previous = (streams.name_of(stream), streams.version_of(session, stream))
    if previous == (target.name, target.version):
        raise ConflictError(
            f"stream {stream_id!r} runs {target.name} version {target.version} already",
            stream=stream_id,
        )
    if target.learned is not None:
        period = target.learned.sample_period_s
    else:
        period = stream.sample_period_s if stream.sample_period_s is not None else 0.1
    stored = stored_range(session, stream, samples, samples, most=0)
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
        time_of=times_of(session, stream_id),
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
        checkpoint_due=streams.next_checkpoint(stream_id, samples),
        saved_samples=None,  # (written below)
    )
    streams.checkpoint(session, switched, force=True)
    pending = pending_of(session)
    pending.held[stream_id].live = None
    pending.restored[stream_id] = streams.restore(session, [stream_id])[stream_id][0]
    return Switched(previous, applied)


def adopt(
    streams: LiveStreams,
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
    with streams.database.session() as session:
        if streams.owns is not None and not streams.owns(session, stream_id):
            return None  # another worker holds it now, and fits it again
        # The stream's lock first, then its row: ingest holds the lock while its inserts
        # need the row, so the other order could deadlock.
        try:
            streams.hold(session, [stream_id])  # no request moves it meanwhile
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
        pending = pending_of(session)
        pending.restored.pop(stream_id, None)
        pending.held[stream_id].live = None
        if learned is None:
            return alarm_repo.Applied([], [])  # still learning, with its error, next touch
        version = catalogue.first_fit(session, streams.store, stream, learned, end, now=now)
        _succeeded(session, job_id, version, now=now)
        saved.history_from = reading_repo.first_time(session, stream_id=stream_id)
        if saved.history_from is not None:
            saved.relearn_at = next_relearning(streams, stream, None, saved.history_from)

        # The learning phase's open alarms end where learning ended (their incidents too).
        ending = [
            AlarmEvent(row.detector, row.opened_sample, end, row.peak, row.threshold, end)
            for row in alarm_repo.list_open(session, stream_id=stream_id)
        ]
        checkpoint_repo.delete(session, stream_id)
        live, replayed = streams.restore(session, [stream_id], events_from=end)[stream_id]
        open_events = live.recurrence.monitor.open_events(live.state.monitor)
        applied = alarm_repo.apply(
            session,
            stream_id=stream_id,
            opened=replayed.opened,
            closed=ending + replayed.closed,
            peaks={event.detector: event.peak for event in open_events},
            time_of=times_of(session, stream_id),
            model_name=live.model_name,
            model_version=live.model_version,
            channels=live.channels,
        )
        live.open_peaks = {event.detector: event.peak for event in open_events}
        if live.state.samples:
            streams.checkpoint(session, live, force=True)
        live.checkpoint_due = streams.next_checkpoint(stream_id, live.state.samples)
        pending.restored[stream_id] = live
    return applied


def adopt_revision(
    streams: LiveStreams,
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
    with streams.database.session() as session:
        if streams.owns is not None and not streams.owns(session, stream_id):
            return False  # another worker holds it now, and revises it again
        try:
            live = streams.hold(session, [stream_id])[0]
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
            session, streams.store, stream, learned, monitor, live.state.samples, now=now
        )
        _succeeded(session, job_id, version, now=now)
        prune_versions(streams, session, stream_id)
        if live.state.samples:
            streams.checkpoint(session, live, force=False)
        pending = pending_of(session)
        pending.restored.pop(stream_id, None)
        pending.held[stream_id].live = None
        pending.restored[stream_id] = streams.restore(session, [stream_id])[stream_id][0]
    return True


def prune_versions(streams: LiveStreams, session: Session, stream_id: str) -> None:
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
    shas = catalogue.prune(session, name, kept=streams.retired_kept, keep=keep)
    store = streams.store
    if shas and store is not None:

        def removed() -> None:
            for sha in shas:
                store.remove(sha)

        streams.on_end(session, commit=removed)


def next_relearning(
    streams: LiveStreams, stream: Stream, last_s: float | None, history_from: datetime
) -> datetime | None:
    """When, on its readings' clock, a learned stream whose history began at
    `history_from` learns again after a relearning on `last_s` seconds of it (None: after
    its first fit); None: never."""
    plan = RelearnPlan.of(stream.learning) if streams.relearning else None
    due = None if plan is None else plan.next_at(last_s)
    return None if due is None else history_from + timedelta(seconds=due)


def schedule_relearning(streams: LiveStreams) -> int:
    """Give the learned streams that have no relearning scheduled one by their own
    schedule (those learned before relearning existed, or while it was off). Returns how
    many it scheduled."""
    if not streams.relearning:
        return 0
    scheduled = 0
    with streams.database.session() as session:
        for stream, row in learned_repo.unscheduled(session):
            if row.history_from is None:
                row.history_from = reading_repo.first_time(session, stream_id=stream.id)
            if row.history_from is not None:
                row.relearn_at = next_relearning(streams, stream, row.relearned_s, row.history_from)
                scheduled += row.relearn_at is not None
    return scheduled


def times_of(session: Session, stream_id: str) -> Callable[[int], datetime]:
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
