"""Waiting for a job of a running service (a test client or a real server's)."""

from __future__ import annotations

import time
from typing import Any

import httpx

FINISHED = ("succeeded", "failed", "cancelled")


def finished(client: httpx.Client, job_id: int, timeout_s: float = 300) -> dict[str, Any]:
    """The job once it has finished; AssertionError if it has not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["phase"] in FINISHED:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")
