"""The app factory: `create_app(settings)` builds one independent service instance.

The lifespan opens the database (migrating it when configured), loads every model artifact,
records them in the models table and yields the typed `AppState` that requests reach through
`app.api.deps`. Nothing here is global, so tests can run several apps side by side.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypedDict

import anyio
from fastapi import FastAPI

from app import __version__
from app.api import alarms, health, incidents, jobs, models, readings, shadows, streams
from app.api.bodies import BODIES
from app.api.deps import AppState, DocumentsAccessMiddleware
from app.api.openapi import document_schemas
from app.api.problems import BodySizeLimitMiddleware, install_problem_handlers
from app.bus.jetstream import open_bus, worker_name
from app.bus.publisher import BusAwayError, batches_of, store_all
from app.catalogue import register_models
from app.errors import UnavailableError
from app.forecasting.training import use_one_thread
from app.jobs.runner import JobRunner
from app.logs import RequestIdMiddleware
from app.metrics import Metrics
from app.mqtt.payloads import Items
from app.mqtt.subscriber import Commit, MqttIngest
from app.registry import (
    AUTO,
    ArtifactLoader,
    ModelRegistry,
    default_loader,
    load_models,
    model_directories,
)
from app.schemas import Problem
from app.service.readings import check_size, commit_readings
from app.settings import Settings
from app.storage import migrations
from app.storage.artifact_store import ArtifactStore
from app.storage.db import Database
from app.storage.repositories import incidents as incident_repo
from app.storage.repositories import streams as stream_repo
from app.storage.repositories.alarms import Applied
from app.streams.learner import Learner
from app.streams.live import LiveStreams, Restoring
from app.streams.stale import StaleWatch
from app.web import pages

log = logging.getLogger(__name__)


class LifespanState(TypedDict):
    twinwatch: AppState


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


def open_state(settings: Settings, metrics: Metrics, loader: ArtifactLoader) -> AppState:
    """Everything the lifespan does before serving; blocking, so it runs off the event loop."""
    engine = open_engine(settings, metrics, loader, follower=settings.bus_url is not None)
    try:
        # Before the streams resume: it fails the jobs a stopped service left running, and a
        # resumed stream may start a fit (a job) at once.
        runner = JobRunner(engine.database, settings)
        runner.on_finished = engine.learner.job_finished
        engine.learner.wake_jobs = runner.wake
        runner.start()
        scheduled = engine.streams.schedule_relearning()
        if scheduled:
            log.info("%d learned stream(s) given a relearning schedule", scheduled)
    except BaseException:
        engine.database.dispose()
        raise
    return state_of(engine, runner)


def state_of(engine: Engine, jobs: JobRunner) -> AppState:
    """What a request handler works with, over an engine: an API process's, or a worker's
    (which runs the handlers of the changes it makes: `app/api/changes.py`)."""
    return AppState(
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


def resume_behind(state: AppState) -> threading.Thread:
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


def mqtt_ingest(
    state: AppState, watch: StaleWatch | None, loop: asyncio.AbstractEventLoop
) -> MqttIngest:
    """The MQTT subscriber, committing what it takes as a request does: ingested here, or
    stored on the bus for its workers."""
    settings = state.settings
    assert settings.mqtt_url is not None
    bus = state.bus
    commit: Commit
    if bus is None:
        commit = partial(commit_readings, settings, state.database, state.streams, state.metrics)
    else:

        def commit(items: Items, _count_refused: bool) -> object:
            check_size(settings, items)
            stored = asyncio.run_coroutine_threadsafe(store_all(bus, batches_of(items)), loop)
            try:
                stored.result(timeout=settings.bus_wait_s)
            except (BusAwayError, TimeoutError) as exc:
                stored.cancel()
                raise UnavailableError(f"the bus did not store the readings ({exc})") from None
            return None

    return MqttIngest(
        settings.mqtt_url,
        settings.mqtt_topics,
        commit,
        client_id=settings.mqtt_client_id,
        max_bytes=settings.max_body_bytes,
        max_batch=settings.max_batch,
        registry=state.metrics.registry,
        gone=None if watch is None else watch.declare,
    )


def create_app(
    settings: Settings | None = None,
    *,
    artifact_loader: ArtifactLoader | None = None,
    after_startup: Callable[[], None] | None = None,
) -> FastAPI:
    """A new app. `artifact_loader` replaces `load_model` (tests pass tiny fake artifacts);
    `after_startup` runs once the lifespan has loaded everything, before the first request:
    where a server process tunes process-wide settings (`twinwatch serve` freezes the loaded
    objects out of the garbage collector), which an app shared with others must not touch."""
    settings = settings if settings is not None else Settings()
    loader = artifact_loader if artifact_loader is not None else default_loader
    metrics = Metrics(settings.metrics_per_stream)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[LifespanState]:
        state = await anyio.to_thread.run_sync(open_state, settings, metrics, loader)
        if settings.bus_url is not None:
            state.bus = await open_bus(
                settings.bus_url,
                name=f"api-{worker_name()}",
                partitions=settings.bus_partitions,
                lease_s=settings.bus_lease_s,
                replicas=settings.bus_replicas,
            )
        restore = None
        if state.bus is None:
            restore = resume_behind(state)
        else:  # (on the bus, the workers hold the streams)
            state.restoring.finished = True
        watch = None
        if settings.stale_periods > 0 and state.bus is None:
            watch = StaleWatch(
                state.streams,
                metrics,
                periods=settings.stale_periods,
                min_s=settings.stale_min_s,
            )
            watch.start()
        subscriber = None
        if settings.mqtt_url is not None:
            subscriber = mqtt_ingest(state, watch, asyncio.get_running_loop())
            subscriber.start()
        try:
            if after_startup is not None:
                after_startup()
            yield {"twinwatch": state}
        finally:
            if subscriber is not None:
                await anyio.to_thread.run_sync(subscriber.stop)
            if watch is not None:
                await anyio.to_thread.run_sync(watch.stop)
            if restore is not None:
                state.restoring.stop.set()
                await anyio.to_thread.run_sync(restore.join)
            if state.bus is not None:
                await state.bus.close()
            try:
                # A clean stop leaves nothing to replay at the next start (a fit in progress
                # is finished; one queued is done again at the next start).
                await anyio.to_thread.run_sync(state.learner.shutdown)
                await anyio.to_thread.run_sync(state.jobs.stop)
                await anyio.to_thread.run_sync(state.streams.checkpoint_all)
            except Exception:
                log.exception("checkpointing the streams at shutdown failed")
            finally:
                state.database.dispose()

    app = FastAPI(
        title="twinwatch",
        version=__version__,
        summary="Watch machines through their digital twins.",
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    readers = settings.read_tokens()
    document_schemas(
        app,
        [Problem, *BODIES],
        writes_protected=settings.api_token is not None,
        reads_protected=readers is not None,
    )
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    if readers is not None:
        app.add_middleware(DocumentsAccessMiddleware, accepted=readers)
    app.add_middleware(RequestIdMiddleware)  # added last: outermost, so a 413 carries it too
    for module in (health, streams, readings, alarms, incidents, models, jobs, shadows):
        app.include_router(module.router)
    pages.install(app)  # the operator's pages (app/web/)
    return app
