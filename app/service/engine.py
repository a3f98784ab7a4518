"""What processes readings (`Engine`: the models, the streams' live states, their learner) and
what every operation works with (`ServiceState`: the engine and the job runner), opened the
same way by an API process (`app/main.py`) and a bus worker (`app/bus/worker.py`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Self

from sqlalchemy.orm import Session

from app.catalogue import LEARNED, load_learned, load_version, register_models
from app.forecasting.training import use_one_thread
from app.jobs.runner import JobRunner
from app.metrics import Metrics
from app.registry import (
    AUTO,
    ArtifactLoader,
    ModelRegistry,
    RegisteredModel,
    load_models,
    model_directories,
)
from app.settings import Settings
from app.storage import migrations
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.repositories import incidents as incident_repo
from app.storage.repositories import model_versions as version_repo
from app.storage.repositories import streams as stream_repo
from app.storage.repositories.alarms import Applied
from app.streams.handover import Target
from app.streams.learner import Learner
from app.streams.live import LiveStreams, Restoring

log = logging.getLogger(__name__)


@dataclass
class Engine:
    """What processes readings: the models, the streams' live states and their learner. A
    service process opens one (`open_state`), and so does a bus worker (`app/bus/worker.py`)."""

    settings: Settings
    database: Database
    registry: ModelRegistry
    store: ArtifactStore
    metrics: Metrics
    streams: LiveStreams
    learner: Learner
    started_at: datetime
    loader: ArtifactLoader  # how a model version's artifact directory is loaded


def open_engine(
    settings: Settings, metrics: Metrics, loader: ArtifactLoader, *, follower: bool = False
) -> Engine:
    """The database (migrated if asked), the models registered in it, and the streams' engine;
    blocking. `follower`: an API process on the bus, which reads streams and never processes
    or checkpoints one (the workers do). The caller disposes of `database` if what follows
    fails."""
    use_one_thread()
    settings.prepare_directories()
    if settings.migrate_on_start:
        migrations.upgrade(settings.database_url)
    database = Database(settings.database_url)
    try:
        database.ping()
        started_at = datetime.now(UTC)
        registry = load_models(model_directories(settings), loaded_at=started_at, loader=loader)
        if settings.default_model not in registry and settings.default_model != AUTO:
            log.warning("default model %r is not loaded", settings.default_model)
        store = ArtifactStore(settings.artifacts_root)
        registry = register_models(database, registry, store, loader=loader)
        metrics.set_models(registry)
        retention = settings.readings_retention_days
        streams = LiveStreams(
            database,
            registry,
            checkpoint_every=settings.checkpoint_every,
            retention=None if retention is None else timedelta(days=retention),
            store=store,
            follower=follower,
            # (on the bus, not yet: a worker's streams cannot be switched by the job runner)
            relearning=settings.relearning and settings.bus_url is None,
            retired_kept=settings.retired_versions_kept,
        )
        learner = Learner(
            streams,
            on_adopted=lambda stream_id, done: _track(streams, metrics, stream_id, done),
            lstm=settings.learning_lstm,
        )
        streams.on_learning_due = learner.submit
    except BaseException:
        database.dispose()
        raise
    return Engine(
        settings, database, registry, store, metrics, streams, learner, started_at, loader
    )


@dataclass
class ServiceState:
    """What every operation of the service works with: an API process's (its HTTP state adds
    the bus), or a bus worker's, which makes the changes of the streams it holds. One per
    process, never global."""

    settings: Settings
    database: Database
    registry: ModelRegistry
    store: ArtifactStore  # every model version's artifact
    loader: ArtifactLoader  # how an artifact directory is loaded
    metrics: Metrics
    streams: LiveStreams
    learner: Learner
    jobs: JobRunner
    started_at: datetime
    restoring: Restoring = field(default_factory=Restoring)  # the streams' restore at start-up

    @classmethod
    def over(cls, engine: Engine, jobs: JobRunner) -> Self:
        """The state over an engine, with its job runner."""
        return cls(
            settings=engine.settings,
            database=engine.database,
            registry=engine.registry,
            store=engine.store,
            loader=engine.loader,
            metrics=engine.metrics,
            streams=engine.streams,
            learner=engine.learner,
            jobs=jobs,
            started_at=engine.started_at,
        )

    def model_version(self, session: Session, name: str, version: int) -> RegisteredModel:
        """A version of a model, loaded (from the artifact store the first time). NotFoundError
        if the model has no such version."""
        row = version_repo.require(session, name, version)
        return load_version(self.registry, row, self.store, loader=self.loader)

    def target(self, session: Session, name: str, version: int) -> Target:
        """A version, loaded, for a stream to run or be shadowed by: a trained model's or one a
        stream learned (`handover.target_recurrence` says whether a stream may run it).
        NotFoundError if there is no such version."""
        row = version_repo.require(session, name, version)
        if row.kind == LEARNED:
            return Target(name, str(version), learned=load_learned(self.store, row))
        return Target.trained(load_version(self.registry, row, self.store, loader=self.loader))


def _track(
    streams: LiveStreams, metrics: Metrics, stream_id: str, applied: Applied | None = None
) -> None:
    """A stream's metric series for its (new) detectors, with the alarms its switch to a
    learned model raised."""
    with streams.database.session() as session:
        stream = stream_repo.get(session, stream_id)
        if stream is None:
            return
        live = streams.read(session, stream)
        monitor = live.recurrence.monitor
        metrics.track_stream(stream_id, monitor.kinds, monitor.thresholds)
        metrics.set_active(stream_id, live.open_peaks)
        if applied is not None:
            metrics.publish_alarms(
                stream_id,
                opened=[alarm.detector for alarm in applied.new],
                incidents_opened=applied.incidents_opened,
            )
        metrics.set_open_incidents(stream_id, incident_repo.open_counts(session).get(stream_id, 0))


def resume_streams(
    database: Database,
    streams: LiveStreams,
    metrics: Metrics,
    only: Callable[[str], bool] | None = None,
    progress: Restoring | None = None,
) -> None:
    """Restore every stream (`only` those it accepts: a bus worker's partition) from its
    checkpoint and the readings after it, so its metric series (alarm counters included)
    exist from the first scrape after a restart, an alarm raised then is seen as an increase,
    and a stream silent since is seen to be. `progress` follows it."""
    started = time.monotonic()
    for stream_id, problem in streams.restore_all(only, progress):
        log.warning("stream %s cannot resume: %s", stream_id, problem)
    resumed = 0
    for live in streams.live_streams():
        if only is not None and not only(live.stream_id):
            continue
        resumed += 1
        metrics.track_stream(
            live.stream_id, live.recurrence.monitor.kinds, live.recurrence.monitor.thresholds
        )
        metrics.set_active(live.stream_id, live.open_peaks)
        if live.stale_since is not None:
            metrics.publish_stale(live.stream_id, stale=True)
    with database.session() as session:
        for stream in stream_repo.list_all(session):
            if only is None or only(stream.id):
                metrics.track_stream(stream.id, detectors=())
        for stream_id, count in incident_repo.open_counts(session).items():
            if only is None or only(stream_id):
                metrics.set_open_incidents(stream_id, count)
    log.info("%d streams resumed in %.1f s", resumed, time.monotonic() - started)


def resume_behind(state: ServiceState) -> threading.Thread:
    """The streams restored in a thread of their own, so that the port opens at once: a
    request for a stream not restored yet restores that stream first."""

    def run() -> None:
        try:
            with state.database.outage.background("restoring the streams"):
                resume_streams(
                    state.database, state.streams, state.metrics, progress=state.restoring
                )
        except Exception:
            log.exception("restoring the streams failed; each is restored when it is asked for")
        finally:
            state.restoring.finished = True

    thread = threading.Thread(target=run, name="twinwatch-restore", daemon=True)
    thread.start()
    return thread
