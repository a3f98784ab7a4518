"""Jobs a user asks for on a stream's stored readings (a retrain, a recalibration: a candidate
version of its model, run in a process of its own by app/jobs/), and their cancellation."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from app.errors import ConflictError, DataError
from app.registry import AUTO
from app.schemas import JobIn, JobOut
from app.service.engine import ServiceState
from app.storage.models import LEARNER_JOBS, Job
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import streams as stream_repo


def queue(state: ServiceState, session: Session, stream_id: str, body: JobIn) -> Job:
    """A job queued on the stream (the runner woken once it is committed); refused with a
    ConflictError while the stream still learns, a DataError if it has no readings."""
    stream = stream_repo.require(session, stream_id)
    if stream.model_name == AUTO and stream.model_version is None:
        raise ConflictError(
            f"stream {stream_id!r} is still learning: a job works on the model it learns",
            stream=stream_id,
        )
    if stream.model_name == AUTO and body.epochs is not None:
        raise DataError(
            f"stream {stream_id!r} learns its own model, which has no epochs: leave them out",
            stream=stream_id,
        )
    if not stream.sample_count and state.streams.position(stream_id) in (None, (0, None)):
        raise DataError(f"stream {stream_id!r} has no readings to work on", stream=stream_id)
    job = job_repo.create(
        session, stream_id=stream_id, kind=body.kind, params=body.params(), now=datetime.now(UTC)
    )
    state.streams.on_end(session, commit=state.jobs.wake)
    return job


def cancel(state: ServiceState, session: Session, job_id: int) -> JobOut:
    """A queued or running job cancelled (a running one's process is ended: it makes no
    version); a ConflictError for a finished one or a learning stream's own."""
    job = job_repo.require(session, job_id)
    if job.kind in LEARNER_JOBS:
        raise ConflictError(
            f"job {job_id} is a learning stream's {job.kind}: the service runs it to its end",
            job=job_id,
        )
    if not job_repo.move(
        session, job_id, to="cancelled", when=("queued", "running"), finished_at=datetime.now(UTC)
    ):
        raise ConflictError(f"job {job_id} has {job.phase} already", job=job_id)
    state.streams.on_end(session, commit=lambda: state.jobs.cancel(job_id))
    return JobOut.of(job_repo.require(session, job_id))
