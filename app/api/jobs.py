"""Jobs: `POST /v1/streams/{id}/jobs` queues one (202), `GET /v1/jobs[/{id}]` says how they
go, `DELETE /v1/jobs/{id}` cancels one. They run in `app/jobs/`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from app.api.bodies import JobBody, json_body_openapi
from app.api.deps import ReadAccess, SessionDep, SingleQueryValues, StateDep, WriteAccess
from app.api.queries import LimitQuery, StreamQuery
from app.schemas import STREAM_ID_PATTERN, JobIn, JobList, JobOut, problem_responses
from app.service import jobs
from app.storage.repositories import jobs as job_repo

router = APIRouter(tags=["jobs"], dependencies=[ReadAccess, SingleQueryValues])

JobIdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]
StreamIdPath = Annotated[str, Path(pattern=STREAM_ID_PATTERN, description="The stream's id.")]
JobCursor = Annotated[
    str | None,
    Query(pattern=r"^[1-9][0-9]{0,17}$", description="`next_cursor` of the previous page."),
]


@router.post(
    "/v1/streams/{stream_id}/jobs",
    response_model=JobOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(400, 401, 404, 409, 413, 422),
    dependencies=[WriteAccess],
    summary="Retrain or recalibrate the stream's model on its stored readings",
    operation_id="createJob",
    openapi_extra=json_body_openapi(JobIn),
)
def create_job(
    stream_id: StreamIdPath,
    body: JobBody,
    session: SessionDep,
    state: StateDep,
    response: Response,
) -> JobOut:
    """Queue a job that makes a candidate version of the stream's model from its stored
    readings of a period (taken as normal operation). Jobs run one at a time, each in a
    process of its own, so ingest goes on meanwhile; follow it with `GET /v1/jobs/{id}`. The
    candidate runs nowhere until a stream is switched to it (`POST /v1/streams/{id}/model`).
    For a stream of model "auto" the candidate is a version of its learned models
    (`auto.<stream id>`): a recalibration fits its detectors' thresholds again on the period,
    a retrain learns the stream afresh from it."""
    job = jobs.queue(state, session, stream_id, body)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return JobOut.of(job)


@router.get(
    "/v1/jobs",
    response_model=JobList,
    responses=problem_responses(422),
    summary="Jobs, newest first, a page at a time",
    operation_id="listJobs",
)
def list_jobs(
    session: SessionDep,
    stream: StreamQuery = None,
    limit: LimitQuery = 100,
    cursor: JobCursor = None,
) -> JobList:
    jobs = job_repo.page(
        session, stream_id=stream, limit=limit, before=None if cursor is None else int(cursor)
    )
    more = len(jobs) == limit
    return JobList(
        items=[JobOut.of(job) for job in jobs],
        next_cursor=str(jobs[-1].id) if more else None,
    )


@router.get(
    "/v1/jobs/{job_id}",
    response_model=JobOut,
    responses=problem_responses(404, 422),
    summary="One job: its phase, progress, and the version it made or why it failed",
    operation_id="getJob",
)
def get_job(job_id: JobIdPath, session: SessionDep) -> JobOut:
    return JobOut.of(job_repo.require(session, job_id))


@router.delete(
    "/v1/jobs/{job_id}",
    response_model=JobOut,
    responses=problem_responses(401, 404, 409, 422),
    dependencies=[WriteAccess],
    summary="Cancel a queued or running job",
    operation_id="cancelJob",
)
def cancel_job(job_id: JobIdPath, session: SessionDep, state: StateDep) -> JobOut:
    """A running job's process is ended; it makes no version. A finished job cannot be
    cancelled (409), nor a learning stream's fit or revision (kinds `learn`, `revise`)."""
    return jobs.cancel(state, session, job_id)
