"""`twinwatch jobs list | show | cancel`: a running service's jobs (retrain, recalibrate), over
its HTTP API; `show --follow` draws a running job's progress until it ends."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.cli.models import DEFAULT_URL, UrlOption, call
from app.errors import AppError

FINISHED = ("succeeded", "failed", "cancelled")


def _outcome(job: dict[str, Any]) -> str:
    if job["phase"] == "succeeded" and job["result"]:
        return f"made {job['result']['name']} version {job['result']['version']}"
    if job["phase"] == "failed":
        return str(job["error"])
    return ""


def list_command(
    stream: Annotated[str | None, typer.Option(help="Only this stream's jobs.")] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """The latest jobs, newest first."""
    params = None if stream is None else {"stream": stream}
    table = Table("job", "stream", "kind", "phase", "created at", "outcome")
    for job in call(url, "GET", "/v1/jobs", params=params)["items"]:
        table.add_row(
            str(job["id"]),
            job["stream"],
            job["kind"],
            job["phase"],
            job["created_at"],
            _outcome(job),
        )
    Console().print(table)


def show_command(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    follow: Annotated[
        bool, typer.Option("--follow", help="Draw its progress until it ends.")
    ] = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """A job: its phase and progress, the version it made or why it failed."""
    job = call(url, "GET", f"/v1/jobs/{job_id}")
    if follow and job["phase"] not in FINISHED:
        epochs = job["params"].get("epochs")
        columns = [TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
        with Progress(*columns, transient=True) as progress:
            task = progress.add_task(f"job {job_id}", total=epochs)
            while job["phase"] not in FINISHED:
                step = job["progress"].get("step", job["phase"])
                loss = job["progress"].get("loss")
                described = f"job {job_id}: {step}" + (f", loss {loss:.4g}" if loss else "")
                progress.update(
                    task, description=described, completed=job["progress"].get("epoch", 0)
                )
                time.sleep(1)
                job = call(url, "GET", f"/v1/jobs/{job_id}")
    typer.echo(f"job {job_id} ({job['kind']} of stream {job['stream']}): {job['phase']}")
    outcome = _outcome(job)
    if outcome:
        typer.echo(outcome)
    if job["phase"] == "failed":
        raise AppError(f"job {job_id} failed")


def cancel_command(
    job_id: Annotated[int, typer.Argument(help="The job's id.")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Cancel a queued or running job (it makes no version)."""
    job = call(url, "DELETE", f"/v1/jobs/{job_id}")
    typer.echo(f"job {job_id}: {job['phase']}")
