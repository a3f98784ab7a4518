"""`twinwatch simulate`: write the built-in twin's output (and its faults) to CSV."""

from __future__ import annotations

from collections.abc import Sequence
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


def resolve_faults(faults: str | None) -> list[Fault]:
    """`lab` for the four built-in faults, otherwise a schedule file."""
    if faults is None:
        return []
    if faults == "lab":
        return list(LAB_FAULTS)
    return load_schedule(faults)


def describe_faults(faults: Sequence[Fault]) -> str:
    """'spike +1.5 at 7100, excitation x2 over 7450..7749, ...': a schedule in a help line."""
    parts = []
    for fault in faults:
        size = ""
        if fault.magnitude is not None:
            size = f" {fault.magnitude:+g}"
        elif fault.factor is not None:
            size = f" x{fault.factor:g}"
        last = fault.end - 1
        where = f"at {fault.start}" if last == fault.start else f"over {fault.start}..{last}"
        parts.append(f"{fault.type.value}{size} {where}")
    return ", ".join(parts)


FAULTS_HELP = (
    f"'lab' for the four built-in faults ({describe_faults(LAB_FAULTS)}; sample indices), "
    "or a JSON schedule file: a list of {type, start, end, magnitude or factor}."
)


def simulate_command(
    out: Annotated[
        Path, typer.Option("--out", help="CSV to write: t (seconds), value, reference.")
    ],
    seed: Annotated[int, typer.Option(help="Random seed of the machine's noise.")] = 0,
    samples: Annotated[int, typer.Option(help="Number of samples, 0.1 s apart.")] = 8000,
    faults: Annotated[str | None, typer.Option(help=FAULTS_HELP)] = None,
) -> None:
    """Write a run of the built-in digital twin to CSV, optionally with injected faults.

    The twin is a forced, damped Duffing oscillator sampled every 0.1 s: the value column is its
    sensor, the reference column a redundant healthy sensor. With --faults the schedule is also
    written beside the CSV as NAME.faults.json, the file twinwatch evaluate monitor --faults
    reads.
    """
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
