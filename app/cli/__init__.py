"""Command line: `twinwatch simulate | train | calibrate | evaluate | serve | twin | demo | send |
streams | alarms | incidents | db | model | models | jobs`.

The command modules define plain functions; `build_cli` below is the one place that names every
command and group, so a new command is one module and one line here. The commands are thin: they
parse options, call the library, print. An `AppError` becomes a one-line message and exit code
2, never a traceback.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from app.cli import (
    benchmark,
    evaluate_forecast,
    jobs,
    model,
    models,
    monitoring,
    operate,
    service,
    simulate,
    train,
    twin,
)
from app.errors import AppError
from app.settings import settings_help

__all__ = ["build_cli", "cli", "main"]


def build_cli() -> typer.Typer:
    """The `twinwatch` application, its commands in the order `twinwatch --help` lists them."""
    root = _group(
        "twinwatch",
        "Watch machines through their digital twins: forecast each sensor stream, run detectors "
        "on the residuals, raise alarms.",
    )
    root.command("simulate")(simulate.simulate_command)
    root.command("train")(train.train_command)
    root.command("calibrate")(monitoring.calibrate_command)
    root.command("serve", epilog=settings_help())(service.serve_command)
    root.command("worker")(service.worker_command)
    root.command("twin")(twin.twin_command)
    root.command("demo")(twin.demo_command)

    root.command("send")(operate.send_command)
    remote = "(--url, or TWINWATCH_URL; the token from TWINWATCH_API_TOKEN)"
    streams = _group("streams", f"A running service's streams {remote}.")
    streams.command("list")(operate.streams_list_command)
    root.add_typer(streams)
    alarms = _group("alarms", f"A running service's alarms: list, acknowledge {remote}.")
    alarms.command("list")(operate.alarms_list_command)
    alarms.command("ack")(operate.alarms_ack_command)
    root.add_typer(alarms)
    incidents = _group(
        "incidents",
        f"A running service's incidents (the alarms of one fault together): list, acknowledge "
        f"{remote}.",
    )
    incidents.command("list")(operate.incidents_list_command)
    incidents.command("ack")(operate.incidents_ack_command)
    root.add_typer(incidents)

    evaluate = _group(
        "evaluate",
        "Score forecasters (walk-forward errors), detectors (on known faults) and the whole "
        "service on labelled data sets.",
    )
    evaluate.command("forecast")(evaluate_forecast.evaluate_forecast_command)
    evaluate.command("monitor")(monitoring.evaluate_monitor_command)
    evaluate.command("benchmark")(benchmark.evaluate_benchmark_command)
    root.add_typer(evaluate)

    db = _group("db", "Migrate or inspect the database schema (TWINWATCH_DATABASE_URL).")
    db.command("upgrade")(service.db_upgrade_command)
    db.command("downgrade")(service.db_downgrade_command)
    db.command("current")(service.db_current_command)
    root.add_typer(db)

    artifacts = _group("model", "Manage model artifacts.")
    artifacts.command("export-graph")(model.export_graph_command)
    root.add_typer(artifacts)

    versions = _group(
        "models",
        "A running service's model versions, and switching a stream between them "
        "(--url, or TWINWATCH_URL; the token from TWINWATCH_API_TOKEN).",
    )
    versions.command("list")(models.list_command)
    versions.command("show")(models.show_command)
    versions.command("promote")(models.promote_command)
    versions.command("rollback")(models.rollback_command)
    root.add_typer(versions)

    work = _group(
        "jobs",
        "A running service's jobs: retrain or recalibrate a stream's model on its stored "
        "readings (--url, or TWINWATCH_URL; the token from TWINWATCH_API_TOKEN).",
    )
    work.command("list")(jobs.list_command)
    work.command("show")(jobs.show_command)
    work.command("cancel")(jobs.cancel_command)
    root.add_typer(work)
    return root


def _group(name: str, description: str) -> typer.Typer:
    # No pretty tracebacks: an AppError is one line (see main), anything else a plain trace.
    return typer.Typer(
        name=name,
        help=description,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode="markdown",  # a docstring's hard-wrapped lines are one paragraph
    )


cli = build_cli()


def main() -> None:
    """The `twinwatch` console script."""
    try:
        cli()
    except AppError as exc:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]error:[/] {escape(exc.detail)}", highlight=False
        )
        sys.exit(2)
