"""`twinwatch model export-graph DIR`: give an artifact written before graphs its graph."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli.root import cli

model_cli = typer.Typer(help="Manage model artifacts.", no_args_is_help=True)
cli.add_typer(model_cli, name="model")


@model_cli.command("export-graph")
def export_graph_command(
    directory: Annotated[Path, typer.Argument(help="Model directory (holds manifest.json).")],
) -> None:
    """Export a neural model's inference graph (model.onnx) from its weights (needs torch: the
    train extra); the weights are left as they are."""
    from app.forecasting.artifacts import GRAPH_FILE, export_graph

    loaded = export_graph(directory)
    typer.echo(
        f"wrote {directory / GRAPH_FILE} (sha256 {loaded.manifest['graph_sha256'][:12]}...) "
        f"for {loaded.manifest['kind']}"
    )
