"""`twinwatch model export-graph DIR`: give an artifact written before graphs its graph."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_graph_command(
    directory: Annotated[Path, typer.Argument(help="Model directory (holds manifest.json).")],
) -> None:
    """Write the inference graph (model.onnx) of a model trained by an earlier twinwatch, from
    its weights; the weights are left as they are. Needs the training extra (torch):
    pip install 'twinwatch[train]'."""
    from app.forecasting.artifacts import GRAPH_FILE, export_graph

    loaded = export_graph(directory)
    typer.echo(
        f"wrote {directory / GRAPH_FILE} (sha256 {loaded.manifest['graph_sha256'][:12]}...) "
        f"for {loaded.manifest['kind']}"
    )
