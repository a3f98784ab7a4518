"""The `twinwatch worker` process: the engine opened as an API process opens it
(app/service/engine.py), the bus, and a `Worker` (app/bus/worker.py) until a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from prometheus_client import start_http_server

from app.bus.jetstream import open_bus, worker_name
from app.bus.worker import Worker
from app.errors import DataError
from app.metrics import Metrics
from app.registry import default_loader
from app.service.engine import open_engine
from app.settings import Settings

log = logging.getLogger(__name__)


async def run_worker(
    settings: Settings,
    *,
    metrics_port: int | None,
    name: str | None,
    after_startup: Callable[[], None] | None = None,
) -> None:
    """The `twinwatch worker` process: until SIGTERM or SIGINT (then its partitions are given
    back at once, after a checkpoint of its streams). `after_startup`: once the engine is
    open (the serving process's garbage-collector tuning, as for `twinwatch serve`)."""
    if not settings.bus_url:
        raise DataError("a worker needs the bus: set TWINWATCH_BUS_URL (nats://host:4222)")
    metrics = Metrics(settings.metrics_per_stream)
    engine = await asyncio.to_thread(open_engine, settings, metrics, default_loader)
    if after_startup is not None:
        after_startup()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    name = name or worker_name()
    bus = await open_bus(
        settings.bus_url,
        name=name,
        partitions=settings.bus_partitions,
        lease_s=settings.bus_lease_s,
        replicas=settings.bus_replicas,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("worker %s on %s, %d partitions", name, settings.bus_url, bus.partitions)
    try:
        await Worker(engine, bus, name).run(stop)
    finally:
        await bus.close()
        await asyncio.to_thread(engine.learner.shutdown)
        engine.database.dispose()
