"""The Typer applications every command module registers on."""

from __future__ import annotations

import typer

cli = typer.Typer(
    name="twinwatch",
    help="Watch machines through their digital twins.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
evaluate_cli = typer.Typer(help="Measure forecasters and monitors honestly.", no_args_is_help=True)
db_cli = typer.Typer(help="Database schema management.", no_args_is_help=True)
cli.add_typer(evaluate_cli, name="evaluate")
cli.add_typer(db_cli, name="db")
