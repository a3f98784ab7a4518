"""Runs the queued jobs, one at a time, each in a process of its own (`app/jobs/process.py`),
from a thread of the service. A job cancelled while it runs has its process ended; a process
that dies without finishing its job fails the job with the end of what it wrote to stderr;
at start-up, jobs a stopped service left running are failed (their process went with it)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from app import catalogue
from app.learning.relearn import RelearnPlan
from app.settings import Settings
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import streams as stream_repo
from app.storage.repositories.jobs import INTERRUPTED

log = logging.getLogger(__name__)

POLL_S = 0.2


class JobRunner:
    def __init__(self, database: Database, settings: Settings) -> None:
        self.database = database
        self.settings = settings
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._guard = threading.Lock()
        self._running: tuple[int, subprocess.Popen[bytes]] | None = None
        self._cancelled: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="twinwatch-jobs", daemon=True)
        # Called with each job's id once its process has ended (a relearned candidate's proof
        # starts there: app/streams/learner.py).
        self.on_finished: Callable[[int], None] | None = None

    def start(self) -> None:
        with self.database.session() as session:
            failed = job_repo.fail_interrupted(session, now=datetime.now(UTC))
            requeued = self._relearn_again(session)
        if failed:
            log.warning("%d job(s) failed: the service stopped while they ran", failed)
        for stream_id, job_id in requeued:
            log.info(
                "stream %s: its interrupted relearning queued again (job %d)", stream_id, job_id
            )
        self._thread.start()

    def _relearn_again(self, session: Session) -> list[tuple[str, int]]:
        """A relearning is the service's own work on a schedule that has moved on: one a stop
        interrupted is queued again (once: a relearning that took the service down with it is
        not tried at every start), if the stream still relearns; a user's job stays failed,
        for its user to ask again."""
        if not self.settings.relearning:
            return []
        again = []
        for job in job_repo.interrupted_relearnings(session):
            stream = stream_repo.get(session, job.stream_id)
            if stream is not None and RelearnPlan.of(stream.learning) is not None:
                new = job_repo.run_again(session, job, now=datetime.now(UTC))
                again.append((new.stream_id, new.id))
        return again

    def wake(self) -> None:
        """A job was queued."""
        self._wake.set()

    def cancel(self, job_id: int) -> None:
        """End the job's process if it is the one running (its phase is already cancelled)."""
        with self._guard:
            self._cancelled.add(job_id)
            running = self._running
        if running is not None and running[0] == job_id:
            running[1].terminate()

    def stop(self) -> None:
        """End the running job's process (the job fails: a restart does not resume it)."""
        self._stopping.set()
        self._wake.set()
        with self._guard:
            running = self._running
        if running is not None:
            running[1].terminate()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        with self.database.session() as session:
            job_repo.fail_interrupted(session, now=datetime.now(UTC))

    def _loop(self) -> None:
        self._remove_orphans()
        while not self._stopping.is_set():
            ran = False
            try:
                with self.database.outage.background("the job runner"):
                    ran = self._run_next()
            except Exception:
                log.exception("the job runner failed; it goes on")
                ran = False
            if not ran:
                self._wake.wait(timeout=5)
                self._wake.clear()

    def _remove_orphans(self) -> None:
        """Remove the artifacts that jobs which failed or were cancelled left in the store
        (`catalogue.orphans`), from the runner's thread: the service is answering already."""
        store = ArtifactStore(self.settings.artifacts_root)
        try:
            doomed = catalogue.orphans(self.database, store)
            for sha in doomed:  # (unless reused since it was found)
                store.remove(sha, older_than_s=catalogue.ORPHAN_AGE_S)
        except Exception:
            log.exception("the artifacts no version refers to were not removed")
            return
        if doomed:
            log.info("%d artifact(s) no version refers to removed from the store", len(doomed))

    def _run_next(self) -> bool:
        if self._stopping.is_set():
            return False
        with self.database.session() as session:
            job = job_repo.next_queued(session)
            if job is None:
                return False
            job_id = job.id
            if not job_repo.move(
                session, job_id, to="running", when="queued", started_at=datetime.now(UTC)
            ):
                return True  # cancelled meanwhile
        env = {
            **os.environ,
            "TWINWATCH_DATABASE_URL": self.settings.database_url,
            "TWINWATCH_ARTIFACTS_DIR": str(self.settings.artifacts_root),
            # One core for the job: the others stay the service's.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        command = [sys.executable, "-m", "app.jobs.process", str(job_id), str(os.getpid())]
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
            with self._guard:
                self._running = (job_id, process)
                if job_id in self._cancelled or self._stopping.is_set():
                    process.terminate()
            log.info("job %d started (process %d)", job_id, process.pid)
            code = process.wait()
            with self._guard:
                self._running = None
                self._cancelled.discard(job_id)
            stderr.seek(0)
            tail = stderr.read()[-1500:].decode(errors="replace").strip()
        error = f"the job's process ended with code {code}: {tail}"[:2000]
        if self._stopping.is_set():
            error = INTERRUPTED
        with self.database.session() as session:
            failed = job_repo.move(
                session,
                job_id,
                to="failed",
                when="running",
                error=error,
                finished_at=datetime.now(UTC),
            )
            row = job_repo.get(session, job_id)
            final = "deleted with its stream" if row is None else row.phase
        if failed:
            log.error("job %d failed: its process ended with code %d", job_id, code)
        else:
            log.info("job %d %s", job_id, final)
        if self.on_finished is not None:
            try:
                self.on_finished(job_id)
            except Exception:
                log.exception("what follows job %d failed", job_id)
        return True
