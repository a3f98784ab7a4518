"""The learner: the service's thread that fits a learning stream once its learning readings
are in (a job of kind `learn`), revises a learned stream's thresholds (`revise`), queues its
relearning (`relearn`, fitted in a job process: app/jobs/process.py) and decides on a relearned
candidate (`prove`). Each makes a version of the stream's learned models, which the stream runs
at once (`handover.adopt`, `adopt_revision`). The learning phase itself, and the replay the
streams run, are in app/streams/learning.py."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from app.errors import AppError, DataError
from app.learning.adapt import next_revision
from app.learning.learn import LearnedModel, learn
from app.learning.relearn import verdict
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import jobs as job_repo
from app.storage.repositories import learned as learned_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.storage.repositories.alarms import Applied
from app.streams import handover
from app.streams.blocks import Readings
from app.streams.learning import (
    LearningPlan,
    revised_monitor,
)
from app.streams.live import LiveStreams
from app.streams.recomputed import shadowed

log = logging.getLogger(__name__)


class Learner:
    """Fits learning streams in one background thread, each at most once at a time."""

    def __init__(
        self,
        streams: LiveStreams,
        *,
        on_adopted: Callable[[str, Applied], None] | None = None,
        lstm: bool = False,
    ) -> None:
        self.streams = streams
        self.on_adopted = on_adopted
        self.lstm = lstm  # offer the stateful LSTM among the candidates (app/learning/network.py)
        self.wake_jobs: Callable[[], None] | None = None  # a relearning job was queued
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinwatch-learn")
        self._queued: set[str] = set()
        self._again: set[str] = set()  # asked for while queued: fit again once done
        self._guard = threading.Lock()

    def submit(self, stream_id: str) -> Future[None] | None:
        """Fit the stream soon (if it is queued already: once more after that run, which may
        have read a configuration changed since)."""
        with self._guard:
            if stream_id in self._queued:
                self._again.add(stream_id)
                return None
            self._queued.add(stream_id)
        try:
            return self._executor.submit(self._run, stream_id)
        except RuntimeError:  # shutting down: the next start fits it
            with self._guard:
                self._queued.discard(stream_id)
            return None

    def busy(self, stream_id: str) -> bool:
        with self._guard:
            return stream_id in self._queued

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    @contextmanager
    def _job(self, stream_id: str, kind: str, params: dict[str, Any]) -> Iterator[Outcome]:
        """The job row of a fit or revision: running while the block runs, which makes it
        succeed with the version it makes (`handover.adopt` and `adopt_revision`, in the
        transaction that makes it), or else failed, or cancelled if it was superseded."""
        now = datetime.now(UTC)
        with self.streams.database.session() as session:
            if stream_repo.get(session, stream_id) is None:
                job_id = None
            else:
                job_id = job_repo.create(
                    session, stream_id=stream_id, kind=kind, params=params, now=now, running=True
                ).id
        outcome = Outcome(job_id)
        try:
            yield outcome
        except Exception as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if job_id is not None:
                self._finish(job_id, outcome)

    def _finish(self, job_id: int, outcome: Outcome) -> None:
        now = datetime.now(UTC)
        with self.streams.database.session() as session:
            if outcome.error is not None:
                job_repo.move(
                    session,
                    job_id,
                    to="failed",
                    when="running",
                    error=outcome.error[:2000],
                    finished_at=now,
                )
            elif outcome.superseded:
                why = outcome.superseded
                if not isinstance(why, str):
                    why = "the stream changed meanwhile (a change fits it again)"
                job_repo.move(
                    session,
                    job_id,
                    to="cancelled",
                    when="running",
                    error=f"superseded: {why}",
                    finished_at=now,
                )
            else:  # (one that made its version succeeded with it: this changes nothing)
                job_repo.move(
                    session,
                    job_id,
                    to="failed",
                    when="running",
                    error="it ended without a version",
                    finished_at=now,
                )

    def _run(self, stream_id: str) -> None:
        try:
            if not self.fit(stream_id):
                self.revise(stream_id)
                self.relearn(stream_id)
                self.prove(stream_id)
        except Exception:
            log.exception("learning stream %s failed", stream_id)
        finally:
            with self._guard:
                self._queued.discard(stream_id)
                again = stream_id in self._again
                self._again.discard(stream_id)
        if again:
            self.submit(stream_id)

    def revise(self, stream_id: str) -> bool:
        """Fit a learned stream's thresholds again on its normal readings since it learned
        (app/learning/adapt.py) and adopt them from its next reading on. Returns whether it
        did (nothing to do: not learned, not due)."""
        with self.streams.database.session() as session:
            stream = stream_repo.get(session, stream_id)
            row = learned_repo.get(session, stream_id)
            if stream is None or row is None or row.model is None:
                return False
            learned = LearnedModel.from_json(row.model)
            fitted_at, revisions = row.fitted_at, len(row.revisions)
            since = row.revisions[-1]["from_sample"] if row.revisions else row.learned_from
            if reading_repo.count(session, stream_id=stream_id) < next_revision(learned, since):
                return False
            batches = reading_repo.batches_from(session, stream_id=stream_id)
            spans = alarm_repo.spans(session, stream_id=stream_id)
            has_reference = stream.has_reference
        if not batches or batches[-1].stop < next_revision(learned, since):
            return False
        with self._job(stream_id, "revise", {"from_sample": since}) as outcome:
            done = self._revised(
                stream_id,
                learned,
                batches,
                spans,
                fitted_at=fitted_at,
                revisions=revisions,
                has_reference=has_reference,
                outcome=outcome,
            )
        return done

    def _revised(
        self,
        stream_id: str,
        learned: LearnedModel,
        batches: list[reading_repo.StoredBatch],
        spans: list[tuple[int, int | None]],
        *,
        fitted_at: datetime,
        revisions: int,
        has_reference: bool,
        outcome: Outcome,
    ) -> bool:
        times = np.concatenate([b.micros for b in batches])
        values = np.concatenate([b.values for b in batches])
        references = (
            np.concatenate([b.references_or_nan for b in batches]) if has_reference else None
        )
        # Readings a retention period removed are gone: sample numbers count from the first
        # one kept (`first`).
        first = batches[0].first_sample
        monitor = revised_monitor(
            learned,
            Readings.of_one(times, values, references),
            covered=[
                (start - first, None if stop is None else stop - first)
                for start, stop in spans
                if stop is None or stop > first
            ],
        )
        adopted = handover.adopt_revision(
            self.streams,
            stream_id,
            monitor,
            fitted_at=fitted_at,
            revisions=revisions,
            job_id=outcome.job_id,
        )
        if adopted:
            log.info("stream %s: thresholds revised on its readings to %d", stream_id, len(times))
        else:
            outcome.superseded = True
        return adopted

    def relearn(self, stream_id: str) -> bool:
        """Queue the job that learns a learned stream again on its history (app/jobs/
        process.py: `relearn`) if it is due, and schedule the next. Returns whether it did. A
        relearning that comes due while another runs or a candidate proves itself is skipped:
        that one is decided first."""
        with self.streams.database.session() as session:
            row = learned_repo.get(session, stream_id)
            stream = stream_repo.get(session, stream_id)
            if stream is None or row is None or row.model is None or row.relearn_at is None:
                return False
            last = reading_repo.last_time(session, stream_id=stream_id)
            if last is None or last < row.relearn_at or row.history_from is None:
                return False
            live = self.streams.hold(session, [stream_id])[0]
            span = (last - row.history_from).total_seconds()
            due = handover.next_relearning(self.streams, stream, row.relearned_s, row.history_from)
            queued = None
            busy = row.prove_at is not None or job_repo.open_of(
                session, stream_id=stream_id, kind="relearn"
            )
            if due is not None and due <= last and not busy:
                queued = job_repo.create(
                    session,
                    stream_id=stream_id,
                    kind="relearn",
                    params={"readings": live.state.samples, "history_s": span},
                    now=datetime.now(UTC),
                )
            if due is not None and due <= last:  # (done, or skipped): the next one
                row.relearned_s = span
                due = handover.next_relearning(self.streams, stream, span, row.history_from)
            row.relearn_at = due
            after = None if due is None else reading_repo.micro(due)
            self.streams.on_end(session, commit=lambda: setattr(live, "relearn_at", after))
        if queued is not None:
            log.info(
                "stream %s: relearning on %.0f s of history (job %d)", stream_id, span, queued.id
            )
            if self.wake_jobs is not None:
                self.wake_jobs()
        return queued is not None

    def job_finished(self, job_id: int) -> None:
        """A job's process ended: a relearning that made a candidate has set it to shadow the
        stream (in the transaction that made it); the stream learns when it is decided on."""
        with self.streams.database.session() as session:
            job = job_repo.get(session, job_id)
            if job is None or job.kind != "relearn" or job.phase != "succeeded":
                return
            stream_id = job.stream_id
        with contextlib.suppress(RuntimeError):  # shutting down: a restart reads it
            self._executor.submit(self._proving, stream_id)

    def _proving(self, stream_id: str) -> None:
        """The stream learns when its candidate is decided on, and it is decided on at once if
        the readings that came meanwhile have reached that time already."""
        try:
            with self.streams.database.session() as session:
                row = learned_repo.get(session, stream_id)
                if row is None:
                    return
                live = self.streams.hold(session, [stream_id])[0]
                at = None if row.prove_at is None else reading_repo.micro(row.prove_at)
                self.streams.on_end(session, commit=lambda: setattr(live, "prove_at", at))
            self.prove(stream_id)
        except Exception:
            log.exception("stream %s: its candidate's proof failed", stream_id)

    def prove(self, stream_id: str) -> bool:
        """Decide on a relearned candidate once it has shadowed the stream for its proving
        period (app/learning/relearn.py, `verdict`), and with no alarm open: promoted with its
        reason, or discarded; a job of kind `prove` keeps both models' figures. Returns
        whether it decided."""
        with self.streams.database.session() as session:
            row = learned_repo.get(session, stream_id)
            if row is None or row.prove_at is None:
                return False
            last = reading_repo.last_time(session, stream_id=stream_id)
            if last is None or last < row.prove_at:
                return False
            shadow = version_repo.relearned_shadow(session, stream_id)
            params = (
                {}
                if shadow is None
                else {
                    "name": shadow.model_name,
                    "version": shadow.model_version,
                    "from_sample": shadow.from_sample,
                }
            )
        try:
            with self._job(stream_id, "prove", params) as outcome:
                return self._proved(stream_id, outcome)
        except Exception:  # (its job failed, saying why): not tried again at every reading
            self._abandon_proof(stream_id)
            raise

    def _abandon_proof(self, stream_id: str) -> None:
        with self.streams.database.session() as session:
            live = self.streams.hold(session, [stream_id])[0]
            row = learned_repo.get(session, stream_id)
            if row is not None:
                row.prove_at = None
            self.streams.on_end(session, commit=lambda: setattr(live, "prove_at", None))
            if version_repo.relearned_shadow(session, stream_id) is not None:
                version_repo.end_shadow(session, stream_id)

    def _proved(self, stream_id: str, outcome: Outcome) -> bool:
        # The replay of the proving readings, without holding the stream: ingest goes on.
        with self.streams.database.session() as session:
            row = learned_repo.get(session, stream_id)
            stream = stream_repo.require(session, stream_id)
            shadow = version_repo.relearned_shadow(session, stream_id)
            if row is None or row.prove_at is None or shadow is None:
                proving = None
            else:
                proving = (
                    row.prove_at,
                    shadow.model_name,
                    shadow.model_version,
                    shadow.from_sample,
                )
                candidate_row = version_repo.require(
                    session, shadow.model_name, shadow.model_version
                )
                target = handover.learned_target(self.streams, candidate_row)
                candidate = handover.target_recurrence(self.streams, stream, target)
                running = self.streams.model_of(session, stream)
                both = shadowed(session, stream, running, shadow.from_sample, candidate)
        if proving is None:
            self._abandon_proof(stream_id)  # (ended, or replaced by a user, meanwhile)
            outcome.superseded = "its shadow was ended or replaced meanwhile"
            return False
        _, name, version, _ = proving
        decided = None
        result: dict[str, Any] = {"promoted": False, "reason": "no reading to prove it on"}
        if both.running is not None and both.candidate is not None:
            decided = verdict(both.running, both.candidate)
            result = {
                "promoted": decided.promoted,
                "reason": decided.reason,
                "readings": both.running.monitored,
                "running": {
                    "version": both.version,
                    "forecast_rmse": decided.running_rmse,
                    "incidents": decided.running_incidents,
                },
                "candidate": {
                    "version": version,
                    "forecast_rmse": decided.candidate_rmse,
                    "incidents": decided.candidate_incidents,
                },
            }
        # The decision, holding the stream, if nothing changed meanwhile.
        with self.streams.database.session() as session:
            live = self.streams.hold(session, [stream_id])[0]
            row = learned_repo.get(session, stream_id)
            shadow = version_repo.relearned_shadow(session, stream_id)
            now_proving = (
                None
                if row is None or shadow is None
                else (row.prove_at, shadow.model_name, shadow.model_version, shadow.from_sample)
            )
            if now_proving != proving:
                outcome.superseded = "its proof changed meanwhile"
                return False
            if live.open_peaks and result["promoted"]:
                # A switch closes the open alarms: the promotion waits until they have closed.
                outcome.superseded = "an alarm is open: it is decided once the alarms close"
                return False
            assert row is not None
            row.prove_at = None
            self.streams.on_end(session, commit=lambda: setattr(live, "prove_at", None))
            version_repo.end_shadow(session, stream_id)
            candidate_row = version_repo.require(session, name, version)
            if decided is not None and decided.promoted:
                handover.switch(
                    self.streams,
                    session,
                    stream_id,
                    handover.learned_target(self.streams, candidate_row),
                    reason=f"proved on its readings: {decided.reason}",
                )
                version_repo.refresh_statuses(session, name)
            else:
                candidate_row.status = "retired"  # discarded: it never ran
            handover.prune_versions(self.streams, session, stream_id)
            if outcome.job_id is not None:
                job_repo.move(
                    session,
                    outcome.job_id,
                    to="succeeded",
                    when="running",
                    result={"name": name, "version": version, **result},
                    finished_at=datetime.now(UTC),
                )
        log.info(
            "stream %s: relearned candidate %s: %s",
            stream_id,
            "promoted" if result["promoted"] else "discarded",
            result["reason"],
        )
        return True

    def fit(self, stream_id: str) -> bool:
        """Learn the stream from its stored learning readings and switch it to monitoring.
        Returns whether it now monitors."""
        with self.streams.database.session() as session:
            stream = stream_repo.get(session, stream_id)
            if stream is None:
                return False
            learned_row = learned_repo.get(session, stream_id)
            if learned_row is not None and learned_row.model is not None:
                return False  # learned already
            generation = stream.updated_at
            plan = LearningPlan.of(stream.learning)
            batches = reading_repo.batches_from(session, stream_id=stream_id)
            period, budget = stream.sample_period_s, stream.false_alarms_per_day
            has_reference = stream.has_reference
        times = np.concatenate([b.micros for b in batches]) if batches else np.empty(0, np.int64)
        end = plan.end(times)
        if end is None:
            return False
        with self._job(stream_id, "learn", {"readings": end}) as outcome:
            done = self._fitted(
                stream_id,
                times,
                batches,
                end=end,
                period=period,
                budget=budget,
                has_reference=has_reference,
                generation=generation,
                outcome=outcome,
            )
        return done

    def _fitted(
        self,
        stream_id: str,
        times: np.ndarray,
        batches: list[reading_repo.StoredBatch],
        *,
        end: int,
        period: float | None,
        budget: float,
        has_reference: bool,
        generation: datetime,
        outcome: Outcome,
    ) -> bool:
        values = np.concatenate([b.values for b in batches])[:end]
        references = None
        if has_reference:
            references = np.concatenate([b.references_or_nan for b in batches])[:end]
        learned: LearnedModel | None = None
        error = None
        try:
            learned = learn(
                times[:end],
                values,
                sample_period_s=period,
                false_alarms_per_day=budget,
                references=references,
                lstm=self.lstm,
            )
        except DataError as exc:
            error = exc.detail
        except (ValueError, np.linalg.LinAlgError) as exc:
            error = f"the learning readings could not be fitted: {exc}"
        try:
            applied = handover.adopt(
                self.streams,
                stream_id,
                learned,
                error=error,
                end=end,
                generation=generation,
                job_id=outcome.job_id,
            )
        except AppError as exc:
            log.warning("stream %s: its learned model was not adopted: %s", stream_id, exc)
            outcome.error = exc.detail
            return False
        if applied is None:
            outcome.superseded = True
            return False  # reconfigured meanwhile: the change asked for another fit
        if learned is None:
            log.warning("stream %s could not learn: %s", stream_id, error)
            outcome.error = error
            return False
        log.info(
            "stream %s learned from %d readings: %s",
            stream_id,
            end,
            ", ".join(learned.kinds),
        )
        if self.on_adopted is not None:
            self.on_adopted(stream_id, applied)
        return True


@dataclass
class Outcome:
    """How a learner's job (`job_id`, if it has a row) ended, when it raised nothing: it made
    a version (the stream runs it), could not (`error`), or was overtaken by a change to the
    stream (`superseded`)."""

    job_id: int | None
    error: str | None = None
    superseded: bool | str = False  # (a string: why)
