"""Command line: `twinwatch simulate | train | calibrate | serve | worker | twin | demo | send |
streams | alarms | incidents | evaluate | db | model | models | jobs`.

The command modules define plain functions; `COMMANDS` below is the one place that names every
command and group, so a new command is one module, one builder and one line here. The commands
are thin: they parse options, call the library, print. An `AppError` becomes a one-line
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer import _click as click  # (typer's own copy of click: its groups are made of it)
from typer._click.core import Parameter
from typer.core import TyperCommand, TyperGroup

from app.errors import AppError

__all__ = ["COMMANDS", "build_cli", "cli", "main"]

REMOTE = "(--url, or TWINWATCH_URL; the token from TWINWATCH_API_TOKEN)"


# Each command's module is imported when the command runs (or its own help is asked for), not
# when `twinwatch --help` lists them: numpy, pydantic, SQLAlchemy and httpx stay unloaded.


def _simulate() -> typer.Typer:
    from app.cli import simulate

    return _single("simulate", simulate.simulate_command)


def _train() -> typer.Typer:
    from app.cli import train

    return _single("train", train.train_command)


def _calibrate() -> typer.Typer:
    from app.cli import monitoring

    return _single("calibrate", monitoring.calibrate_command)


def _serve() -> typer.Typer:
    from app.cli import service
    from app.settings import settings_help

    return _single("serve", service.serve_command, epilog=settings_help())


def _worker() -> typer.Typer:
    from app.cli import service

    return _single("worker", service.worker_command)


def _twin() -> typer.Typer:
    from app.cli import twin

    return _single("twin", twin.twin_command)


def _demo() -> typer.Typer:
    from app.cli import twin

    return _single("demo", twin.demo_command)


def _send() -> typer.Typer:
    from app.cli import operate

    return _single("send", operate.send_command)


def _streams() -> typer.Typer:
    from app.cli import operate

    group = _group("streams", STREAMS)
    group.command("list")(operate.streams_list_command)
    group.command("apply")(operate.streams_apply_command)
    return group


def _alarms() -> typer.Typer:
    from app.cli import operate

    group = _group("alarms", ALARMS)
    group.command("list")(operate.alarms_list_command)
    group.command("ack")(operate.alarms_ack_command)
    return group


def _incidents() -> typer.Typer:
    from app.cli import operate

    group = _group("incidents", INCIDENTS)
    group.command("list")(operate.incidents_list_command)
    group.command("ack")(operate.incidents_ack_command)
    return group


def _evaluate() -> typer.Typer:
    from app.cli import benchmark, evaluate_forecast, monitoring

    group = _group("evaluate", EVALUATE)
    group.command("forecast")(evaluate_forecast.evaluate_forecast_command)
    group.command("monitor")(monitoring.evaluate_monitor_command)
    group.command("benchmark")(benchmark.evaluate_benchmark_command)
    return group


def _db() -> typer.Typer:
    from app.cli import service

    group = _group("db", DB)
    group.command("upgrade")(service.db_upgrade_command)
    group.command("downgrade")(service.db_downgrade_command)
    group.command("current")(service.db_current_command)
    return group


def _model() -> typer.Typer:
    from app.cli import model

    group = _group("model", MODEL)
    group.command("export-graph")(model.export_graph_command)
    return group


def _models() -> typer.Typer:
    from app.cli import models

    group = _group("models", MODELS)
    group.command("list")(models.list_command)
    group.command("show")(models.show_command)
    group.command("promote")(models.promote_command)
    group.command("rollback")(models.rollback_command)
    return group


def _jobs() -> typer.Typer:
    from app.cli import jobs

    group = _group("jobs", JOBS)
    group.command("list")(jobs.list_command)
    group.command("show")(jobs.show_command)
    group.command("cancel")(jobs.cancel_command)
    return group


STREAMS = f"A running service's streams {REMOTE}."
ALARMS = f"A running service's alarms: list, acknowledge {REMOTE}."
INCIDENTS = (
    f"A running service's incidents (the alarms of one fault together): list, acknowledge {REMOTE}."
)
EVALUATE = (
    "Score forecasters (walk-forward errors), detectors (on known faults) and the whole service "
    "on labelled data sets."
)
DB = "Migrate or inspect the database schema (TWINWATCH_DATABASE_URL)."
MODEL = "Manage model artifacts."
MODELS = (
    "A running service's model versions, and switching a stream between them (--url, or "
    "TWINWATCH_URL; the token from TWINWATCH_API_TOKEN)."
)
JOBS = (
    "A running service's jobs: retrain or recalibrate a stream's model on its stored readings "
    "(--url, or TWINWATCH_URL; the token from TWINWATCH_API_TOKEN)."
)

COMMANDS: dict[str, tuple[Callable[[], typer.Typer], str]] = {
    "simulate": (
        _simulate,
        "Write a run of the built-in digital twin to CSV, optionally with injected faults.",
    ),
    "train": (
        _train,
        "Train a forecaster on the start of a record and save it as a model directory.",
    ),
    "calibrate": (
        _calibrate,
        "Set every detector's threshold from held-out normal data; store them in the manifest.",
    ),
    "serve": (_serve, "Run the service: the HTTP API, /docs and /metrics."),
    "worker": (
        _worker,
        "Process the readings of the bus's partitions this worker leases (TWINWATCH_BUS_URL).",
    ),
    "twin": (_twin, "Run the built-in digital twin and post its readings to a twinwatch service."),
    "demo": (
        _demo,
        "Run the service and the built-in twin together, with a live view of the alarms.",
    ),
    "send": (_send, "Send a CSV of readings to a stream, in order, a batch a request."),
    "streams": (_streams, STREAMS),
    "alarms": (_alarms, ALARMS),
    "incidents": (_incidents, INCIDENTS),
    "evaluate": (_evaluate, EVALUATE),
    "db": (_db, DB),
    "model": (_model, MODEL),
    "models": (_models, MODELS),
    "jobs": (_jobs, JOBS),
}
"""Every command and group, in the order `twinwatch --help` lists them: how to build it, and
the line that list shows (the first sentence of its help: a test holds them equal)."""


class QuietFlags:
    """Help that shows no type beside a flag (`--create`, `--help`): a flag takes no value,
    and `<bool>` there reads as if it did."""

    def get_params(self, ctx: click.Context) -> list[Parameter]:
        params: list[Parameter] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        return params


class LazyGroup(QuietFlags, TyperGroup):
    """The `twinwatch` group: lists `COMMANDS` without importing them, builds one when it is
    run or its help is asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        builder, line = COMMANDS[cmd_name]
        if self._listing:
            return TyperCommand(cmd_name, help=line)
        if cmd_name not in self.commands:
            command = typer.main.get_command(builder())
            command.name = cmd_name
            self.commands[cmd_name] = command
        return self.commands[cmd_name]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def build_cli() -> typer.Typer:
    """The `twinwatch` application (its commands: `COMMANDS`)."""
    root = _typer(
        "twinwatch",
        "Watch machines through their digital twins: forecast each sensor stream, run detectors "
        "on the residuals, raise alarms.",
        cls=LazyGroup,
    )
    root.callback()(_group_itself)
    return root


def _single(name: str, function: Callable[..., None], **options: Any) -> typer.Typer:
    app = _typer(name, None)
    app.command(name, **options)(function)
    return app


def _group(name: str, description: str) -> typer.Typer:
    group = _typer(name, description)
    group.callback()(_group_itself)  # a group even with one command (`twinwatch model ...`)
    return group


def _group_itself() -> None:
    """(A group does nothing itself: its commands do.)"""


class _Command(QuietFlags, TyperCommand):
    pass


class _Group(QuietFlags, TyperGroup):
    pass


class _Typer(typer.Typer):
    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


def _typer(name: str, description: str | None, **options: Any) -> typer.Typer:
    # No pretty tracebacks: an AppError is one line (see main), anything else a plain trace.
    options.setdefault("cls", _Group)
    return _Typer(
        name=name,
        help=description,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode="markdown",  # a docstring's hard-wrapped lines are one paragraph
        **options,
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
