"""The app factory: `create_app(settings)` builds one independent service instance.

The lifespan opens the database (migrating it when configured), loads every model artifact,
records them in the models table and yields the typed `AppState` that requests reach through
`app.api.deps`. Nothing here is global, so tests can run several apps side by side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
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
from app.errors import UnavailableError
from app.jobs.runner import JobRunner
from app.logs import RequestIdMiddleware
from app.metrics import Metrics
from app.mqtt.payloads import Items
from app.mqtt.subscriber import Commit, MqttIngest
from app.registry import (
    ArtifactLoader,
    default_loader,
)
from app.schemas import Problem
from app.service.engine import open_engine, resume_behind
from app.service.readings import check_size, commit_readings
from app.service.streams import create_missing
from app.settings import Settings
from app.streams.handover import schedule_relearning
from app.streams.stale import StaleWatch
from app.web import pages

log = logging.getLogger(__name__)


class LifespanState(TypedDict):
    twinwatch: AppState


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
        scheduled = schedule_relearning(engine.streams)
        if scheduled:
            log.info("%d learned stream(s) given a relearning schedule", scheduled)
    except BaseException:
        engine.database.dispose()
        raise
    return AppState.over(engine, runner)


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
        announce=partial(_announce, state) if settings.mqtt_create_streams else None,
    )


def _announce(state: AppState, items: Items) -> None:
    """A Sparkplug birth's streams made if missing, their channels the metrics it names."""
    wanted = [
        (stream_id, list(dict.fromkeys(n for r in readings for n in r.values or {})))
        for stream_id, readings in items
    ]
    with state.database.session() as session:
        made = create_missing(state, session, wanted)
    if made:
        log.info("MQTT: a Sparkplug birth made stream(s) %s, learning", ", ".join(made))


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
