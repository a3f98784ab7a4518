"""`twinwatch serve` and `twinwatch db upgrade | downgrade | current`."""

from __future__ import annotations

import gc
from typing import Annotated

import typer

from app.logs import configure_logging
from app.settings import load_settings

GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic collector's thresholds while serving. A request holds thousands of objects at once
that reference counting frees (1,000 readings, or 500 streams' results): at Python's default
(700, 10, 10) a tick of many streams runs a dozen young collections for nothing (the figures:
docs/benchmarks.md). Cyclic garbage waits longer, bounded by them."""


def tune_gc_for_serving() -> None:
    """Everything loaded so far (the models, the stream states) lives as long as the process:
    keep it out of the cyclic collector's full passes, which otherwise cost a few hundred
    milliseconds in whichever request triggers one. Process-wide, so the serving process does
    it (through `create_app(after_startup=...)`), never the app factory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve_command(
    host: Annotated[
        str | None,
        typer.Option(help="Interface to bind (default: TWINWATCH_HOST, else 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to bind (default: TWINWATCH_PORT, else 8000).")
    ] = None,
) -> None:
    """Run the service: the HTTP API, /docs and /metrics.

    One uvicorn worker holds every stream's state; the rest of its settings come from the
    TWINWATCH_* environment variables, listed below.
    """
    import uvicorn

    from app.main import create_app

    settings = load_settings()
    if host is not None or port is not None:
        settings = settings.model_copy(
            update={"host": host or settings.host, "port": settings.port if port is None else port}
        )
    configure_logging(settings)
    # One worker: the stream engine's state lives in this process (scale by sharding streams).
    uvicorn.run(
        create_app(settings, after_startup=tune_gc_for_serving),
        host=settings.host,
        port=settings.port,
        log_config=None,  # configure_logging's handler and format serve uvicorn's loggers too
        workers=1,
    )


def db_upgrade_command(
    revision: Annotated[
        str, typer.Argument(help="Revision to migrate to; head is the newest.")
    ] = "head",
) -> None:
    """Migrate the database (TWINWATCH_DATABASE_URL) up to REVISION."""
    from app.storage import migrations  # (alembic: only for these commands)

    settings = load_settings()
    settings.prepare_directories()
    migrations.upgrade(settings.database_url, revision)
    typer.echo(f"database at {_describe(migrations.current(settings.database_url))}")


def db_downgrade_command(
    revision: Annotated[
        str, typer.Argument(help="Revision to migrate to; base removes the whole schema.")
    ],
) -> None:
    """Migrate the database (TWINWATCH_DATABASE_URL) down to REVISION."""
    from app.storage import migrations  # (alembic: only for these commands)

    settings = load_settings()
    migrations.downgrade(settings.database_url, revision)
    typer.echo(f"database at {_describe(migrations.current(settings.database_url))}")


def db_current_command() -> None:
    """Print the database's revision (TWINWATCH_DATABASE_URL) and whether it is the newest."""
    from app.storage import migrations  # (alembic: only for these commands)

    settings = load_settings()
    revisions = migrations.current(settings.database_url)
    head = migrations.head()
    status = "up to date" if revisions == (head,) else f"head is {head}"
    typer.echo(f"{_describe(revisions)} ({status})")


def _describe(revisions: tuple[str, ...]) -> str:
    return ", ".join(revisions) if revisions else "base (no schema)"


def worker_command(
    metrics_port: Annotated[
        int,
        typer.Option(help="Port of this worker's /metrics for Prometheus (0: none)."),
    ] = 9100,
    name: Annotated[
        str | None,
        typer.Option(help="This worker's name on the bus (default: host, process id, random)."),
    ] = None,
) -> None:
    """Process the readings of the bus's partitions this worker leases (TWINWATCH_BUS_URL).

    Start any number: they share the partitions, and take over those of one that stops. Each
    commits to TWINWATCH_DATABASE_URL (PostgreSQL) before it acknowledges a batch.
    """
    import asyncio

    from app.bus.process import run_worker

    settings = load_settings()
    configure_logging(settings)
    asyncio.run(
        run_worker(
            settings,
            metrics_port=metrics_port or None,
            name=name,
            after_startup=tune_gc_for_serving,
        )
    )
