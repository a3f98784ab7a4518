"""`twinwatch simulate`: write the built-in twin's output (and its faults) to CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.errors import DataError
from app.series import write_csv
from app.simulation.faults import LAB_FAULTS, Fault, inject_faults, load_schedule, write_schedule
from app.simulation.twin import simulate


def faults_sidecar(csv_path: Path) -> Path:
    """`data.csv` -> `data.faults.json`."""
    return csv_path.with_name(csv_path.stem + ".faults.json")


def resolve_faults(spec: str | None) -> list[Fault]:
    """`lab` for the lab's four faults, otherwise a schedule file."""
    if spec is None:
        return []
    if spec == "lab":
        return list(LAB_FAULTS)
    return load_schedule(spec)


def simulate_command(
    out: Annotated[Path, typer.Option("--out", help="CSV to write (t,value,reference).")],
    seed: Annotated[int, typer.Option(help="Random seed of the machine's noise.")] = 0,
    samples: Annotated[int, typer.Option(help="Number of samples (0.1 s each).")] = 8000,
    faults: Annotated[
        str | None,
        typer.Option(help="'lab' for the lab's four faults, or a JSON schedule file."),
    ] = None,
) -> None:
    """Simulate the Duffing machine of SPEC section 4, optionally with injected faults."""
    if samples < 1:
        raise DataError("--samples must be at least 1")
    fault_list = resolve_faults(faults)
    run = inject_faults(seed, samples, fault_list) if fault_list else simulate(seed, samples)
    write_csv(run.to_series(), out)
    typer.echo(f"wrote {samples} samples to {out}")
    if fault_list:
        sidecar = faults_sidecar(out)
        write_schedule(fault_list, sidecar)
        typer.echo(f"wrote {len(fault_list)} faults to {sidecar}")
