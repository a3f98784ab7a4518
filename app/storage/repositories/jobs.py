"""Jobs (`jobs`): queued, claimed by the runner, advanced by their process, finished once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from app.errors import NotFoundError
from app.storage.models import Job

INTERRUPTED = "the service stopped while the job ran"


def create(
    session: Session,
    *,
    stream_id: str,
    kind: str,
    params: dict[str, Any],
    now: datetime,
    running: bool = False,
) -> Job:
    """A job, queued (or `running` already: one the service runs at once, a learner's)."""
    job = Job(
        stream_id=stream_id,
        kind=kind,
        params=params,
        phase="running" if running else "queued",
        progress={},
        created_at=now,
        started_at=now if running else None,
    )
    session.add(job)
    session.flush()
    return job


def get(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def require(session: Session, job_id: int) -> Job:
    job = get(session, job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} does not exist", job=job_id)
    return job


def page(session: Session, *, stream_id: str | None, limit: int, before: int | None) -> list[Job]:
    """Newest first, `limit` of them, with ids below `before` (the previous page's last)."""
    statement = select(Job)
    if stream_id is not None:
        statement = statement.where(Job.stream_id == stream_id)
    if before is not None:
        statement = statement.where(Job.id < before)
    return list(session.scalars(statement.order_by(Job.id.desc()).limit(limit)))


def latest(session: Session, *, stream_id: str, kinds: tuple[str, ...]) -> Job | None:
    """The stream's newest job of one of `kinds`."""
    statement = select(Job).where(Job.stream_id == stream_id, Job.kind.in_(kinds))
    return session.scalars(statement.order_by(Job.id.desc()).limit(1)).first()


def next_queued(session: Session) -> Job | None:
    """The oldest queued job, those users asked for before scheduled relearnings."""
    scheduled = case((Job.kind == "relearn", 1), else_=0)
    statement = select(Job).where(Job.phase == "queued").order_by(scheduled, Job.id).limit(1)
    return session.scalars(statement).first()


def open_of(session: Session, *, stream_id: str, kind: str) -> bool:
    """Whether the stream has a job of `kind` queued or running."""
    statement = select(Job.id).where(
        Job.stream_id == stream_id, Job.kind == kind, Job.phase.in_(("queued", "running"))
    )
    return session.scalar(statement.limit(1)) is not None


def move(
    session: Session, job_id: int, *, to: str, when: str | tuple[str, ...], **values: Any
) -> bool:
    """Set the job's phase (and other columns) if it is in phase `when`: the one way a job's
    phase changes, so a cancel and a finish racing each other never both win."""
    phases = (when,) if isinstance(when, str) else when
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.phase.in_(phases))
        .values(phase=to, **values)
        .execution_options(synchronize_session=False)
    )
    session.expire_all()
    return bool(getattr(result, "rowcount", 0))


def set_progress(session: Session, job_id: int, progress: dict[str, Any]) -> bool:
    """Record how far a running job has got; False if it is not running any more."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.phase == "running")
        .values(progress=progress)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0))


def fail_interrupted(session: Session, *, now: datetime) -> int:
    """At start-up: jobs a stopped service left running failed (their process is gone)."""
    result = session.execute(
        update(Job)
        .where(Job.phase == "running")
        .values(phase="failed", error=INTERRUPTED, finished_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


AGAIN_OF = "again_of"
"""A relearning's parameter: the interrupted one it runs again (it is not run a third time)."""


def interrupted_relearnings(session: Session) -> list[Job]:
    """The streams' latest relearnings where a stop interrupted them, unless they were
    themselves running an interrupted one again."""
    latest = select(func.max(Job.id)).where(Job.kind == "relearn").group_by(Job.stream_id)
    statement = select(Job).where(
        Job.id.in_(latest), Job.phase == "failed", Job.error == INTERRUPTED
    )
    return [job for job in session.scalars(statement).all() if AGAIN_OF not in job.params]


def run_again(session: Session, job: Job, *, now: datetime) -> Job:
    """A new queued job with `job`'s kind and parameters (the readings it works on)."""
    params = {**job.params, AGAIN_OF: job.id}
    return create(session, stream_id=job.stream_id, kind=job.kind, params=params, now=now)
