"""A stream's configuration and model version, and what is known of it: the operations the
HTTP API (app/api/streams.py), the operator's pages and, on the bus, the stream's worker
(app/bus/changes.py) all run. No transport here: each adapter maps its wire format to these
inputs and the service's errors (app/errors.py) to its own answers."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.errors import AppError, ConflictError, DataError
from app.learning.learn import LearnedModel
from app.learning.thresholds import LEARNED_DETECTORS
from app.monitoring.config import MISSING_READINGS
from app.registry import AUTO
from app.schemas import (
    ChannelModelOut,
    DetectorLive,
    LearnedModelOut,
    LearningConfig,
    LearningOut,
    ModelChoice,
    ProvingOut,
    RelearningOut,
    StreamConfig,
    StreamList,
    StreamLive,
    StreamOut,
    StreamsConfigured,
)
from app.service.engine import ServiceState
from app.storage.models import Alarm, Stream
from app.storage.models import LearnedModel as LearnedModelRow
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import incidents as incident_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams import handover
from app.streams.held import LiveStream
from app.streams.overrides import refuse_absent_detectors
from app.streams.stale import stale_limit_s

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _detector_overrides(config: StreamConfig) -> dict[str, Any]:
    return {
        name: override.model_dump(mode="json", exclude_none=True)
        for name, override in config.detectors.items()
    }


def _identity(stream: Stream) -> tuple[str, list[str], bool]:
    """What the stream's accepted readings and state depend on."""
    return stream.model_name, list(stream.channels), stream.has_reference


@dataclass(frozen=True)
class _Plan:
    """A stream's configuration as it is stored, with the detectors it gets: what a PUT
    checks before it touches the database."""

    model_name: str
    channels: list[str]
    sample_period_s: float | None
    has_reference: bool
    overrides: dict[str, Any]
    learning: dict[str, Any] | None
    false_alarms_per_day: float
    kinds: tuple[str, ...]
    thresholds: dict[str, float]


def _plan(state: ServiceState, config: StreamConfig) -> _Plan:
    """The stream `config` asks for, or a DataError saying why there can be none."""
    model_name = config.model or state.settings.default_model
    overrides = _detector_overrides(config)
    learning = None
    if model_name == AUTO:
        unknown = sorted(set(overrides) - set(LEARNED_DETECTORS))
        if unknown:
            raise DataError(
                f"a learning stream has no detector {', '.join(unknown)}: it may get "
                f"{', '.join(LEARNED_DETECTORS)}"
            )
        if all(not overrides.get(kind, {}).get("enabled", True) for kind in LEARNED_DETECTORS):
            raise DataError("every detector is disabled: the stream would never alarm")
        channels = list(config.channels) if config.channels is not None else ["value"]
        learning = (config.learning or LearningConfig()).as_json()
        # While it learns, a stream watches for missing readings only.
        kinds: tuple[str, ...] = (MISSING_READINGS.kind,)
        thresholds: dict[str, float] = {MISSING_READINGS.kind: MISSING_READINGS.threshold}
        period = config.sample_period_s
    else:
        if config.learning is not None or "false_alarms_per_day" in config.model_fields_set:
            raise DataError(
                f"'learning' and 'false_alarms_per_day' are for model {AUTO!r} streams; "
                f"{model_name!r} is trained and calibrated"
            )
        model = state.registry.require(model_name)
        channels = list(config.channels) if config.channels is not None else model.channels
        n_channels = model.forecaster.n_channels
        if len(channels) != n_channels:
            raise DataError(
                f"model {model_name!r} takes {n_channels} channel(s), the stream names "
                f"{len(channels)}",
                model=model_name,
            )
        refuse_absent_detectors(model, overrides)
        recurrence = state.streams.kinds.recurrence_for(model, overrides)  # refuses an unusable one
        kinds, thresholds = tuple(recurrence.monitor.kinds), recurrence.monitor.thresholds
        period = config.sample_period_s if config.sample_period_s is not None else 0.1
    return _Plan(
        model_name=model_name,
        channels=channels,
        sample_period_s=period,
        has_reference=config.has_reference,
        overrides=overrides,
        learning=learning,
        false_alarms_per_day=config.false_alarms_per_day,
        kinds=kinds,
        thresholds=thresholds,
    )


def _row(stream_id: str, plan: _Plan) -> stream_repo.NewStream:
    return stream_repo.NewStream(
        stream_id=stream_id,
        model_name=plan.model_name,
        channels=plan.channels,
        sample_period_s=plan.sample_period_s,
        has_reference=plan.has_reference,
        detector_overrides=plan.overrides,
        learning=plan.learning,
        false_alarms_per_day=plan.false_alarms_per_day,
    )


def _update(
    state: ServiceState, session: Session, stream: Stream, plan: _Plan, now: datetime
) -> Stream:
    """The stream reconfigured: what its readings depend on may change only while it has none."""
    accepted = reading_repo.any_for(session, stream_id=stream.id)
    if accepted and _identity(stream) != (plan.model_name, plan.channels, plan.has_reference):
        raise ConflictError(
            f"stream {stream.id!r} has accepted readings: its model, channels and "
            "has_reference cannot change; delete and re-create it",
            stream=stream.id,
        )
    state.streams.reconfigure(session, stream.id)
    learned = None
    if plan.learning is not None:
        learned = learned_repo.get(session, stream.id)
        if learned is not None and learned.model is None:
            learned_repo.delete(session, stream.id)  # a failed fit: try again
            learned = None
    updated = stream_repo.update(
        session,
        stream,
        model_name=plan.model_name,
        channels=plan.channels,
        sample_period_s=plan.sample_period_s,
        has_reference=plan.has_reference,
        detector_overrides=plan.overrides,
        now=now,
        learning=plan.learning,
        false_alarms_per_day=plan.false_alarms_per_day,
    )
    if learned is not None and learned.history_from is not None:  # on the schedule it has now
        learned.relearn_at = handover.next_relearning(
            state.streams, updated, learned.relearned_s, learned.history_from
        )
    return updated


@dataclass(frozen=True)
class Configured:
    stream: StreamOut
    created: bool  # (else its configuration was replaced)


def configure(
    state: ServiceState, session: Session, stream_id: str, config: StreamConfig
) -> Configured:
    """Create the stream or replace its configuration. The model, the channels and
    `has_reference` shape its state and stored readings: once it has accepted readings they
    cannot change (ConflictError)."""
    plan = _plan(state, config)
    stream = stream_repo.get(session, stream_id, for_update=True)
    created = stream is None
    if stream is None:
        stream = stream_repo.create(session, _row(stream_id, plan), now=_utcnow())
    else:
        stream = _update(state, session, stream, plan, _utcnow())
    model_name, kinds, thresholds = plan.model_name, plan.kinds, plan.thresholds
    answer = described(state, session, stream)
    if answer.live is not None:
        kinds = tuple(answer.live.detectors)
        thresholds = {k: d.threshold for k, d in answer.live.detectors.items()}
    if not state.streams.follower:  # (on the bus, the series are its worker's to export)
        state.metrics.track_stream(stream_id, kinds, thresholds)
    if model_name == AUTO:  # a shorter learning period may be over already
        live = state.streams.read(session, stream)
        state.streams.on_end(session, commit=lambda: state.streams.learn_if_due(live))
    return Configured(answer, created)


def configure_many(
    state: ServiceState,
    session: Session,
    configs: list[tuple[str, StreamConfig]],
    *,
    create_only: bool,
) -> StreamsConfigured:
    """Every stream created, or its configuration replaced, by the rules of `configure`, all or
    nothing (a problem names the stream it is about). `create_only`: existing streams are a
    ConflictError (on the bus, where their workers reconfigure them one at a time)."""
    ids = [stream_id for stream_id, _ in configs]
    twice = sorted({stream_id for stream_id, n in Counter(ids).items() if n > 1})
    if twice:
        raise DataError(f"stream(s) given more than once: {', '.join(twice[:10])}")
    plans = {}
    for stream_id, config in configs:
        with _naming_the_stream(stream_id):
            plans[stream_id] = _plan(state, config)
    existing = {stream.id: stream for stream in stream_repo.get_many(session, ids, for_update=True)}
    if existing and create_only:
        raise ConflictError(
            f"{len(existing)} of the streams exist already (first: {min(existing)!r}): on the "
            "bus, reconfigure each with its own PUT"
        )
    now = _utcnow()
    for stream_id, stream in existing.items():
        with _naming_the_stream(stream_id):
            _update(state, session, stream, plans[stream_id], now)
    created = [stream_id for stream_id in ids if stream_id not in existing]
    stream_repo.create_many(
        session, [_row(stream_id, plans[stream_id]) for stream_id in created], now=now
    )
    if not state.streams.follower:  # (on the bus, the series are its worker's to export)
        for stream_id in ids:
            plan = plans[stream_id]
            state.metrics.track_stream(stream_id, plan.kinds, plan.thresholds)
    for stream in existing.values():
        if stream.model_name == AUTO:  # a shorter learning period may be over already
            live = state.streams.read(session, stream)
            state.streams.on_end(session, commit=partial(state.streams.learn_if_due, live))
    return StreamsConfigured(created=created, updated=list(existing))


def create_missing(
    state: ServiceState, session: Session, wanted: list[tuple[str, list[str]]]
) -> list[str]:
    """The streams of `wanted` (id, channels) that do not exist yet, created as streams that
    learn their own model (as a PUT with `"model": "auto"` and those channels makes them; the
    same checks). Returns the ids it made."""
    existing = {stream.id for stream in stream_repo.get_many(session, [i for i, _ in wanted])}
    configs = []
    for stream_id, channels in wanted:
        if stream_id in existing:
            continue
        try:
            config = StreamConfig.model_validate({"model": AUTO, "channels": channels})
        except ValidationError as exc:
            raise DataError(f"stream {stream_id!r}: {exc.errors()[0]['msg']}") from None
        configs.append((stream_id, config))
    if not configs:
        return []
    return configure_many(state, session, configs, create_only=True).created


@contextmanager
def _naming_the_stream(stream_id: str) -> Iterator[None]:
    """A problem with one stream of many says which."""
    try:
        yield
    except AppError as exc:
        extra = {**exc.extra, "stream": stream_id}
        raise type(exc)(f"stream {stream_id!r}: {exc.detail}", **extra) from None


def _phase(session: Session, stream: Stream, live: LiveStream | None) -> dict[str, Any]:
    """A stream of model "auto": its budget, and its learning progress or learned model."""
    if stream.model_name != AUTO:
        return {}
    phase: dict[str, Any] = {"false_alarms_per_day": stream.false_alarms_per_day}
    if live is None:  # not loaded (or being switched to what it learned): what is stored
        row = learned_repo.get(session, stream.id)
        if row is None or row.model is None:
            return {**phase, "phase": "learning"}
        learned = LearnedModel.from_json(row.model)
        revised_from = row.revisions[-1]["from_sample"] if row.revisions else row.learned_from
        return {**phase, **_learned_phase(session, stream, learned, row, int(revised_from))}
    stream_state = live.state
    if live.learning is not None:
        plan = live.learning.plan
        phase.update(
            phase="learning",
            learning_remaining=plan.remaining(
                stream_state.samples, live.learning.first_time, stream_state.last_time
            ),
            learning=LearningOut(
                readings=plan.readings,
                duration_s=plan.duration_s,
                fitting=live.learning.end is not None and live.learning.error is None,
                error=live.learning.error,
            ),
        )
    elif live.learned is not None:
        row = learned_repo.get(session, stream.id)
        phase.update(_learned_phase(session, stream, live.learned, row, live.revised_from))
    return phase


def _learned_phase(
    session: Session,
    stream: Stream,
    learned: LearnedModel,
    row: LearnedModelRow | None,
    revised_from: int,
) -> dict[str, Any]:
    return {
        "sample_period_s": learned.sample_period_s,
        "learned_model": LearnedModelOut(
            learned_from=learned.readings,
            fitted_at=row.fitted_at if row is not None else _utcnow(),
            sample_period_s=learned.sample_period_s,
            seasons=learned.seasons,
            lstm=learned.network_note,
            revisions=0 if row is None else len(row.revisions),
            thresholds_from=revised_from,
            relearning=None if row is None else _relearning(session, stream, row),
            channels={
                name: ChannelModelOut.model_validate(summary)
                for name, summary in learned.summary(list(stream.channels)).items()
            },
        ),
    }


def _relearning(session: Session, stream: Stream, row: LearnedModelRow) -> RelearningOut:
    shadow = None if row.prove_at is None else version_repo.relearned_shadow(session, stream.id)
    proving = None
    if shadow is not None and row.prove_at is not None:
        proving = ProvingOut(
            name=shadow.model_name,
            version=shadow.model_version,
            from_sample=shadow.from_sample,
            decide_at=row.prove_at,
        )
    job = job_repo.latest(session, stream_id=stream.id, kinds=("relearn", "prove"))
    last = None
    if job is not None:
        last = {"job": job.id, "kind": job.kind, "phase": job.phase, "error": job.error}
        last.update(job.result or {})
    return RelearningOut(next_at=row.relearn_at, proving=proving, last=last)


def described(state: ServiceState, session: Session, stream: Stream) -> StreamOut:
    """The stream's row with its live state (none if its model is not loaded any more)."""
    open_alarms = alarm_repo.list_open(session, stream_id=stream.id)
    switch = version_repo.last_switch(session, stream.id)
    previous, reason = None, None if switch is None else switch.reason
    if switch is not None and switch.from_version.isdigit():
        previous = ModelChoice(name=switch.from_model, version=int(switch.from_version))
    try:
        live = state.streams.read(session, stream)
    except AppError:
        return StreamOut.of(stream, open_alarms=open_alarms).model_copy(
            update={"previous_model": previous, "switch_reason": reason}
        )
    recurrence, stream_state = live.recurrence, live.state
    phase = _phase(session, stream, live)
    settings = state.settings
    if settings.stale_periods > 0:
        phase["stale_after_s"] = stale_limit_s(live, settings.stale_periods, settings.stale_min_s)
    forecasts, residuals, statistics = recurrence.latest(stream_state)
    active = {event.detector for event in recurrence.monitor.open_events(stream_state.monitor)}
    last = stream_state.last_time
    return StreamOut.of(
        stream,
        open_alarms=open_alarms,
        live=StreamLive(
            warmup_remaining=recurrence.warmup_remaining(stream_state),
            last_forecast=forecasts[0],
            last_residual=residuals[0],
            detectors={
                name: DetectorLive(
                    statistic=statistics.get(name), threshold=threshold, active=name in active
                )
                for name, threshold in recurrence.monitor.thresholds.items()
            },
        ),
        position=(stream_state.samples, None if last is None else reading_repo.datetime_at(last)),
    ).model_copy(update={**phase, "previous_model": previous, "switch_reason": reason})


def stream_page(
    session: Session,
    state: ServiceState,
    *,
    limit: int,
    cursor: str | None,
    prefix: str | None = None,
) -> StreamList:
    """A page of streams with their open alarms and live position (the API's and the operator
    page's)."""
    streams, next_cursor = stream_repo.page(session, limit=limit, cursor=cursor, prefix=prefix)
    open_by_stream: dict[str, list[Alarm]] = defaultdict(list)
    for alarm in alarm_repo.list_open(session, stream_ids=[stream.id for stream in streams]):
        open_by_stream[alarm.stream_id].append(alarm)
    return StreamList(
        items=[
            StreamOut.of(
                stream,
                open_alarms=open_by_stream[stream.id],
                position=_position(state.streams.position(stream.id)),
            ).model_copy(update=_phase(session, stream, state.streams.peek(stream.id)))
            for stream in streams
        ],
        next_cursor=next_cursor,
    )


def _position(position: tuple[int, int | None] | None) -> tuple[int, datetime | None] | None:
    if position is None:
        return None
    samples, last = position
    return samples, None if last is None else reading_repo.datetime_at(last)


def switch(state: ServiceState, session: Session, stream_id: str, choice: ModelChoice) -> StreamOut:
    """From its next reading on, the stream runs the version named; a candidate it shadowed
    stops shadowing it (it runs now). NotFoundError for an unknown stream or version."""
    stream_repo.require(session, stream_id)
    target = state.target(session, choice.name, choice.version)
    switched = handover.switch(state.streams, session, stream_id, target)
    shadow = version_repo.shadow_of(session, stream_id)
    if shadow is not None and (shadow.model_name, shadow.model_version) == (
        choice.name,
        choice.version,
    ):
        version_repo.end_shadow(session, stream_id)  # the candidate runs now
    for name in {switched.previous[0], choice.name}:
        version_repo.refresh_statuses(session, name)
    stream = stream_repo.require(session, stream_id)
    answer = described(state, session, stream)
    live = answer.live
    kinds = tuple(live.detectors) if live is not None else ()
    thresholds = {} if live is None else {k: d.threshold for k, d in live.detectors.items()}
    open_incidents = incident_repo.open_counts(session).get(stream_id, 0)

    def published() -> None:
        state.metrics.track_stream(stream_id, kinds, thresholds)
        state.metrics.set_open_incidents(stream_id, open_incidents)

    state.streams.on_end(session, commit=published)
    log.info(
        "stream %s switched from %s version %s to %s version %s",
        stream_id,
        *switched.previous,
        target.name,
        target.version,
    )
    return answer


def delete(state: ServiceState, session: Session, stream_id: str) -> None:
    """The stream gone with its readings, checkpoint and alarms. NotFoundError if unknown."""
    stream_repo.require(session, stream_id)
    state.streams.delete(session, stream_id)
    stream_repo.delete(session, stream_id)
    state.streams.on_end(session, commit=lambda: state.metrics.forget_stream(stream_id))
