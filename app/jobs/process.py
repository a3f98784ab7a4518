"""One job, in a process of its own (`python -m app.jobs.process JOB_ID`, started by
`app/jobs/runner.py`): training there never holds the service's interpreter.

It reads the stream's stored readings and the version the stream runs, computes the candidate
(`app/jobs/work.py`), writes its artifact into the store, and then, in one transaction, adds
the candidate version and marks the job succeeded, only if the job is still running: a job
cancelled, or failed by a restart, meanwhile leaves no version behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.catalogue import LEARNED, learned_fields, load_learned, store_learned
from app.errors import AppError, DataError
from app.forecasting.artifacts import load_model, save_model, update_manifest
from app.forecasting.training import TrainingConfig, holdout_metrics
from app.jobs.work import (
    HOLDOUT_SHARE,
    holdout_thresholds,
    recalibrated_learned,
    relearned,
    retrained,
)
from app.learning.relearn import RELEARN_MOST_READINGS, RelearnPlan, relearned_from_history
from app.registry import AUTO, learned_name, manifest_sha256
from app.settings import Settings
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.models import Job, ModelVersion, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.blocks import Readings
from app.streams.recomputed import REWARM_READINGS

log = logging.getLogger(__name__)


class JobStoppedError(Exception):
    """The job was cancelled, or the service that started it is gone."""


class Reporter:
    """Writes the job's progress; stops the job once it is no longer running."""

    def __init__(self, database: Database, job_id: int, parent: int) -> None:
        self.database, self.job_id, self.parent = database, job_id, parent

    def __call__(self, **progress: Any) -> None:
        if os.getppid() != self.parent:
            raise JobStoppedError("the service that started the job is gone")
        with self.database.session() as session:
            if not job_repo.set_progress(session, self.job_id, progress):
                raise JobStoppedError("the job is not running any more")


def run(job_id: int, settings: Settings, *, parent: int) -> None:
    database = Database(settings.database_url)
    store = ArtifactStore(settings.artifacts_root)
    report = Reporter(database, job_id, parent)
    try:
        try:
            candidate = _candidate(database, store, job_id, report, lstm=settings.relearning_lstm)
        except (AppError, ValueError, np.linalg.LinAlgError) as exc:
            detail = exc.detail if isinstance(exc, AppError) else str(exc)
            with database.session() as session:
                job_repo.move(
                    session,
                    job_id,
                    to="failed",
                    when="running",
                    error=detail[:2000],
                    finished_at=datetime.now(UTC),
                )
            return
        _commit(database, job_id, candidate, parent)
    except JobStoppedError as exc:
        log.info("job %d stopped: %s", job_id, exc)
    finally:
        database.dispose()


def _candidate(
    database: Database, store: ArtifactStore, job_id: int, report: Reporter, *, lstm: bool
) -> dict[str, Any]:
    """The candidate version's row values, its artifact already in the store. `lstm`: a
    relearning offers the stateful LSTM."""
    with database.session() as session:
        job = job_repo.require(session, job_id)
        stream = stream_repo.require(session, job.stream_id)
        current = _running_version(session, stream)
        kind, params, stream_id = job.kind, dict(job.params), stream.id
        first, stop = _period(session, stream_id, params)
        spans = []
        if kind == "relearn":  # its history, to where it was due (the latest, at most)
            stop = int(params["readings"])
            first = max(0, stop - RELEARN_MOST_READINGS)
            spans = alarm_repo.spans(session, stream_id=stream_id)
        batches = reading_repo.batches_covering(
            session, stream_id=stream_id, first_sample=max(0, first - REWARM_READINGS), stop=stop
        )
        period = stream.sample_period_s if stream.sample_period_s is not None else 0.1
        has_reference, channels = stream.has_reference, list(stream.channels)
    if not batches or (stop is not None and stop <= first):
        raise DataError("the stream has no stored reading in the job's period")
    base = batches[0].first_sample
    if kind == "relearn":  # (a retention period may have removed the first ones)
        first = max(first, base)
    times = np.concatenate([b.micros for b in batches])
    values = np.concatenate([b.values for b in batches])
    references = np.concatenate([b.references_or_nan for b in batches]) if has_reference else None
    start = first - base  # positions in the arrays: the period is [start, end)
    end = times.shape[0] if stop is None else min(stop - base, times.shape[0])
    if end <= start:
        raise DataError("the stream has no stored reading in the job's period")
    report(step="reading", readings=end - start)
    budget = params.get("false_alarms_per_day")
    source = {
        "stream": stream_id,
        "since": params.get("since"),
        "until": params.get("until"),
        "readings": end - start,
        "job": job_id,
        "from_version": current.version,
    }
    if kind == "relearn":
        if current.kind != LEARNED:
            raise DataError("only a stream that learned its own model learns it again")
        report(step="learning")
        covered = [(a - first, None if b is None else b - first) for a, b in spans]
        readings = Readings.of_one(
            times[start:end],
            values[start:end],
            None if references is None else references[start:end],
        )
        learned = load_learned(store, current)
        new = relearned_from_history(
            learned,
            readings,
            covered=covered,
            false_alarms_per_day=learned.false_alarms_per_day,
            lstm=lstm,
        )
        return {
            "name": current.name,
            "artifact_sha256": store_learned(store, new),
            "source": source,
            **learned_fields(new, channels),
            "train_end": None,
        }
    if current.kind == LEARNED:
        readings = Readings.of_one(
            times[:end], values[:end], None if references is None else references[:end]
        )
        return _learned_candidate(
            store,
            current,
            kind,
            readings,
            start=start,
            budget=budget,
            source=source,
            report=report,
            channels=channels,
        )
    loaded = load_model(store.path(current.artifact_sha256))
    if budget is None:
        budget = 1.0
    scratch = Path(tempfile.mkdtemp(prefix="twinwatch-job-"))
    try:
        directory = scratch / "artifact"
        if kind == "recalibrate":
            forecaster = loaded.forecaster
            # The readings before the period (up to REWARM_READINGS) warm the stream up.
            warm, hold_from, train_end = 0, start, None
            shutil.copytree(store.path(current.artifact_sha256), directory)
        else:
            train_end = start + int((end - start) * (1 - HOLDOUT_SHARE))
            report(step="training", epoch=0)
            forecaster = retrained(
                loaded.forecaster.config(),
                values[start:train_end],
                train_end=train_end - start,
                epochs=params.get("epochs"),
                on_epoch=lambda record: report(
                    step="training",
                    epoch=int(record["epoch"]),
                    loss=float(record.get("train_loss", float("nan"))),
                ),
            )
            warm, hold_from = start, train_end - start
            save_model(
                forecaster,
                directory,
                extra={
                    "channels": list(loaded.manifest.get("channels", ["value"])),
                    "training": {"stream": stream_id, "samples": train_end - start},
                    "metrics": holdout_metrics(
                        forecaster,
                        values[start:end],
                        train_end - start,
                        validation=TrainingConfig.validation,
                    ),
                },
            )
        report(step="calibrating")
        part = slice(warm, end)
        thresholds, how = holdout_thresholds(
            forecaster,
            Readings.of_one(
                times[part], values[part], None if references is None else references[part]
            ),
            period,
            hold_from=hold_from,
            false_alarms_per_day=budget,
        )
        manifest = update_manifest(
            directory, thresholds=thresholds.model_dump(mode="json"), calibration=how
        )
        sha = manifest_sha256(manifest)
        store.put(directory, sha)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "name": current.name,
        "kind": forecaster.kind,
        "artifact_sha256": sha,
        "source": source,
        "metrics": dict(manifest.get("metrics") or {}),
        "thresholds": thresholds.model_dump(mode="json"),
        "calibration": how,
        "train_end": train_end,
    }


def _learned_candidate(
    store: ArtifactStore,
    current: ModelVersion,
    kind: str,
    readings: Readings,
    *,
    start: int,
    budget: float | None,
    source: dict[str, Any],
    report: Reporter,
    channels: list[str],
) -> dict[str, Any]:
    """A learning stream's candidate: its learned model recalibrated on the period (the
    readings before warm it up), or learned afresh from the period alone."""
    learned = load_learned(store, current)
    if budget is None:  # the one the stream runs with
        budget = learned.false_alarms_per_day
    if kind == "recalibrate":
        report(step="calibrating")
        new = recalibrated_learned(learned, readings, hold_from=start, false_alarms_per_day=budget)
    else:
        report(step="learning")
        period = Readings.of_one(
            readings.times[start:],
            readings.values[start:],
            None if readings.references is None else readings.references[start:],
        )
        new = relearned(learned, period, false_alarms_per_day=budget)
    return {
        "name": current.name,
        "artifact_sha256": store_learned(store, new),
        "source": source,
        **learned_fields(new, channels),
        "train_end": None,
    }


def _running_version(session: Session, stream: Stream) -> ModelVersion:
    """The version the stream runs (a learning stream: the one it learned last)."""
    if stream.model_name == AUTO:
        name, version = learned_name(stream.id), stream.model_version
    else:
        name, version = stream.model_name, version_repo.run_by(session, stream)
    if version is None:
        raise DataError(f"stream {stream.id!r} runs no model version to start from")
    return version_repo.require(session, name, version)


def _period(session: Session, stream_id: str, params: dict[str, Any]) -> tuple[int, int | None]:
    """The samples of the readings taken in [since, until): from `first` to `stop` (None: to
    the last)."""
    since, until = params.get("since"), params.get("until")
    first = 0
    if since is not None:
        found = reading_repo.sample_at_or_after(session, stream_id=stream_id, t=_at(since))
        if found is None:
            raise DataError("the stream has no stored reading in the job's period")
        first = found
    stop = None
    if until is not None:
        stop = reading_repo.sample_at_or_after(session, stream_id=stream_id, t=_at(until))
    return first, stop


def _at(epoch_seconds: float) -> datetime:
    return reading_repo.datetime_at(round(epoch_seconds * 1e6))


def _commit(database: Database, job_id: int, candidate: dict[str, Any], parent: int) -> None:
    """The version and the job's success, in one transaction, if the job still runs."""
    if os.getppid() != parent:
        raise JobStoppedError("the service that started the job is gone")
    now = datetime.now(UTC)
    with database.session() as session:
        job: Job = job_repo.require(session, job_id)
        row = version_repo.create(
            session,
            name=candidate["name"],
            kind=candidate["kind"],
            artifact_sha256=candidate["artifact_sha256"],
            source=candidate["source"],
            metrics=candidate["metrics"],
            thresholds=candidate["thresholds"],
            calibration=candidate["calibration"],
            created_by=f"job {job_id} ({job.kind})",
            now=now,
        )
        result = {"name": row.name, "version": row.version, "calibration": row.calibration}
        if job.kind == "relearn":
            result["proving"] = _start_proving(session, job.stream_id, row, now=now)
        if not job_repo.move(
            session, job_id, to="succeeded", when="running", result=result, finished_at=now
        ):
            raise JobStoppedError("the job is not running any more")


def _start_proving(session: Session, stream_id: str, row: ModelVersion, *, now: datetime) -> str:
    """A relearned candidate shadows its stream from the next reading, to be decided on once
    the readings have gone on for its proving period (the service's learner decides:
    app/streams/learner.py); not if the stream is shadowed by a version a user chose, which
    stays. A candidate it replaces is retired. Says what it did."""
    shadow = version_repo.shadow_of(session, stream_id)
    earlier = version_repo.relearned_shadow(session, stream_id)
    if shadow is not None and earlier is None:
        row.status = "retired"
        return "not proved: the stream is shadowed by a version a user chose"
    if earlier is not None:
        version_repo.require(session, earlier.model_name, earlier.model_version).status = "retired"
    stream = stream_repo.require(session, stream_id)
    learned = learned_repo.get(session, stream_id)
    last = reading_repo.last_time(session, stream_id=stream_id)
    if learned is None or last is None:
        row.status = "retired"
        return "not proved: the stream has not learned"
    plan = RelearnPlan.of(stream.learning) or RelearnPlan()
    sample = reading_repo.count(session, stream_id=stream_id)
    version_repo.set_shadow(
        session, stream_id=stream_id, model=(row.name, row.version), from_sample=sample, now=now
    )
    learned.prove_at = last + timedelta(seconds=plan.proving_s)
    return f"shadows the stream from reading {sample} to {learned.prove_at.isoformat()}"


def _end_with_parent() -> None:
    """Ask Linux to end this process when the service that started it dies (elsewhere the
    job stops at its next progress report)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(OSError):
        os.nice(10)  # the service's requests first
    _end_with_parent()
    job_id, parent = int(sys.argv[1]), int(sys.argv[2])
    run(job_id, Settings(), parent=parent)


if __name__ == "__main__":
    main()
