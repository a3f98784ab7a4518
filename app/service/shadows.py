"""A candidate version shadowing a stream: started from the stream's next reading, compared
on demand with the version the stream runs (both replayed over the stored readings since:
app/streams/shadow.py), ended. The candidate never raises an alarm."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from app.errors import NotFoundError
from app.monitoring.alarms import AlarmEvent
from app.monitoring.calibration import SECONDS_PER_DAY
from app.schemas import Detection, ModelChoice, ShadowOut, ShadowSide
from app.service.engine import ServiceState
from app.storage.models import Shadow, Stream
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import streams as stream_repo
from app.streams.handover import target_recurrence
from app.streams.recomputed import StoredRange, shadowed
from app.streams.shadow import Run

DETECTIONS_SHOWN = 100


def start(state: ServiceState, session: Session, stream_id: str, choice: ModelChoice) -> ShadowOut:
    """The candidate sees the stream's readings from its next one on (one it could run: else a
    ConflictError or DataError); a stream has one shadow at most: this replaces it."""
    stream = stream_repo.require(session, stream_id)
    target = state.target(session, choice.name, choice.version)
    target_recurrence(state.streams, stream, target)  # (one it could run)
    samples = state.streams.read(session, stream).state.samples
    shadow = version_repo.set_shadow(
        session,
        stream_id=stream_id,
        model=(choice.name, choice.version),
        from_sample=samples,
        now=datetime.now(UTC),
    )
    return compared(state, session, stream, shadow)


def compare(state: ServiceState, session: Session, stream_id: str) -> ShadowOut:
    """The stream's shadow compared with what it runs; NotFoundError if it has none."""
    stream = stream_repo.require(session, stream_id)
    shadow = version_repo.shadow_of(session, stream_id)
    if shadow is None:
        raise NotFoundError(f"stream {stream_id!r} has no shadow", stream=stream_id)
    return compared(state, session, stream, shadow)


def end(session: Session, stream_id: str) -> None:
    """The stream's shadow ended; NotFoundError if it has none."""
    stream_repo.require(session, stream_id)
    if not version_repo.end_shadow(session, stream_id):
        raise NotFoundError(f"stream {stream_id!r} has no shadow", stream=stream_id)


def compared(state: ServiceState, session: Session, stream: Stream, shadow: Shadow) -> ShadowOut:
    """Both versions over the stream's stored readings since the shadow started (the latest
    `MOST_RECOMPUTED` at most), each warmed on the readings before."""
    model = state.target(session, shadow.model_name, shadow.model_version)
    candidate = target_recurrence(state.streams, stream, model)
    running = state.streams.name_of(stream)
    both = shadowed(
        session, stream, state.streams.model_of(session, stream), shadow.from_sample, candidate
    )
    empty = ShadowOut(
        stream=stream.id,
        started_at=shadow.started_at,
        from_sample=shadow.from_sample,
        readings=0,
        since_t=None,
        until_t=None,
        active=_side(running, both.version, None, None, 0.0),
        candidate=_side(model.name, model.version, None, None, 0.0),
    )
    stored = both.stored
    if stored is None or both.running is None or both.candidate is None:
        return empty
    times = stored.readings.times
    days = (int(times[-1]) - int(times[stored.skip])) / 1e6 / SECONDS_PER_DAY
    return empty.model_copy(
        update={
            "readings": int(stored.readings.counts[0]) - stored.skip,
            "since_t": float(times[stored.skip]) / 1e6,
            "until_t": float(times[-1]) / 1e6,
            "active": _side(running, both.version, both.running, stored, days),
            "candidate": _side(model.name, model.version, both.candidate, stored, days),
        }
    )


def _side(
    model: str, version: str, scored: Run | None, stored: StoredRange | None, days: float
) -> ShadowSide:
    events = [] if scored is None else scored.events
    detections = [] if stored is None else [_detection(e, stored) for e in events]
    return ShadowSide(
        model=model,
        version=version,
        residual_rmse=None if scored is None else scored.residual_rmse,
        monitored=0 if scored is None else scored.monitored,
        alarms=len(events),
        alarms_per_day=len(events) / days if days > 0 else None,
        detections=detections[-DETECTIONS_SHOWN:],
    )


def _detection(event: AlarmEvent, stored: StoredRange) -> Detection:
    times = stored.readings.times
    last = times.shape[0] - 1

    def at(sample: int) -> float:
        return float(times[min(last, max(0, sample - stored.start))]) / 1e6

    return Detection(
        detector=event.detector,
        start_t=at(event.start),
        end_t=None if event.end is None else at(event.end - 1),
        peak=event.peak,
    )
