"""Command line: `twinwatch simulate | train | calibrate | evaluate | serve | twin | demo | db`.

Each module registers its commands on the Typer apps of `app.cli.root`; the commands are thin:
they parse options, call the library, print. An `AppError` becomes a one-line message and exit
code 2, never a traceback.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

from app.cli import evaluate_forecast as _evaluate_forecast  # noqa: F401  (registers commands)
from app.cli import model as _model  # noqa: F401  (registers commands)
from app.cli import monitoring as _monitoring  # noqa: F401  (registers commands)
from app.cli import service as _service  # noqa: F401  (registers commands)
from app.cli import simulate as _simulate  # noqa: F401  (registers commands)
from app.cli import train as _train  # noqa: F401  (registers commands)
from app.cli import twin as _twin  # noqa: F401  (registers commands)
from app.cli.root import cli
from app.errors import AppError

__all__ = ["cli", "main"]


def main() -> None:
    try:
        cli()
    except AppError as exc:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]error:[/] {escape(exc.detail)}", highlight=False
        )
        sys.exit(2)
