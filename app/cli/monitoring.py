"""`twinwatch calibrate` and `twinwatch evaluate monitor` (SPEC section 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from app.cli.root import cli, evaluate_cli
from app.errors import DataError
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.monitor import DETECTOR_ORDER, MonitorConfig

ModelOption = Annotated[Path, typer.Option("--model", help="Model directory (models/NAME).")]
DataOption = Annotated[Path, typer.Option("--data", help="CSV t,value[,reference].")]
PeriodOption = Annotated[
    float | None,
    typer.Option(
        "--sample-period", help="Seconds per sample for rates per day (default: from the data)."
    ),
]


def _policy(k: int, n: int, m: int) -> AlarmPolicy:
    try:
        return AlarmPolicy(k=k, n=n, m=m)
    except ValidationError as exc:
        raise DataError(f"alarm rule --k {k} --n {n} --m {m}: {exc.errors()[0]['msg']}") from None


@cli.command("calibrate")
def calibrate_command(
    model: ModelOption,
    data: DataOption,
    holdout: Annotated[
        str,
        typer.Option(
            help="Held-out NORMAL samples START:STOP of --data (or 'all' for a separate file)."
        ),
    ],
    false_alarms_per_day: Annotated[
        float | None,
        typer.Option(
            "--false-alarms-per-day",
            help="Target false-alarm events per day, all detectors together "
            "(default: the lab's margins).",
        ),
    ] = None,
    sample_period: PeriodOption = None,
    k: Annotated[int, typer.Option("--k", help="Exceedances that open an event ...")] = 1,
    n: Annotated[int, typer.Option("--n", help="... within this many samples.")] = 1,
    m: Annotated[int, typer.Option("--m", help="Samples back inside that close it.")] = 20,
) -> None:
    """Set every detector's threshold from held-out normal data; store them in the manifest."""
    from app.monitoring.workflow import calibrate  # scipy, matplotlib: not at CLI start-up

    config = calibrate(
        model,
        data,
        holdout,
        false_alarms_per_day=false_alarms_per_day,
        sample_period_s=sample_period,
        alarm=_policy(k, n, m),
    )
    console = Console()
    console.print(_thresholds_table(config))
    note = config.calibration.get("note")
    if note:
        console.print(f"note: {note}", highlight=False)
    console.print(f"wrote the thresholds into {model / 'manifest.json'}", highlight=False)


def _thresholds_table(config: MonitorConfig) -> Table:
    details: dict[str, Any] = config.calibration.get("detectors", {})
    margins: dict[str, str] = config.calibration.get("margins", {})
    table = Table(title=f"thresholds ({config.calibration.get('method')})")
    for column in ("detector", "threshold", "how", "hold-out events/day"):
        table.add_column(column)
    for detector in sorted(config.detectors, key=lambda d: DETECTOR_ORDER.index(d.kind)):
        detail = details.get(detector.kind, {})
        how = margins.get(detector.kind) or detail.get("method", "")
        held = detail.get("holdout_events_per_day")
        table.add_row(
            detector.kind,
            f"{detector.threshold:.4g}",
            how,
            "" if held is None else f"{held:.3g}",
        )
    return table


@evaluate_cli.command("monitor")
def evaluate_monitor_command(
    model: ModelOption,
    data: DataOption,
    faults: Annotated[Path, typer.Option("--faults", help="The faults JSON of --data.")],
    json_out: Annotated[Path, typer.Option("--json", help="Report to write.")],
    holdout: Annotated[
        str | None,
        typer.Option(
            help="Calibrate on START:STOP of --data with the lab's margins "
            "(default: the thresholds in the manifest)."
        ),
    ] = None,
    plots: Annotated[Path | None, typer.Option(help="Directory for the PNG.")] = None,
    normal_days: Annotated[
        float | None,
        typer.Option("--normal-days", help="Also count false alarms on this many clean days."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the clean simulated days (not the data's).")
    ] = None,
    sample_period: PeriodOption = None,
) -> None:
    """Detection delays, events, false alarms per day and precision on injected faults."""
    from app.monitoring.workflow import evaluate  # scipy, matplotlib: not at CLI start-up

    report = evaluate(
        model,
        data,
        faults,
        holdout=holdout,
        plots=plots,
        normal_days=normal_days,
        seed=seed,
        sample_period_s=sample_period,
    )
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=1) + "\n")
    console = Console()
    console.print(_faults_table(report))
    rates = report["false_alarm_events_per_day"]
    console.print(
        f"false-alarm events on {report['normal_samples']} normal samples: "
        + ", ".join(f"{k} {report['false_alarm_events'][k]}" for k in rates),
        highlight=False,
    )
    if "normal_days" in report:
        days = report["normal_days"]
        console.print(
            f"{days['days']} clean day(s), seed {days['seed']}: false-alarm events/day "
            + ", ".join(f"{k} {v:.3g}" for k, v in days["false_alarm_events_per_day"].items()),
            highlight=False,
        )
    console.print(f"wrote {json_out} in {report['seconds']:.1f} s", highlight=False)


def _faults_table(report: dict[str, Any]) -> Table:
    kinds = list(report["thresholds"])
    table = Table(title="detection (events, alarm samples, first delay)")
    table.add_column("fault")
    for kind in kinds:
        table.add_column(kind)
    for fault in report["faults"]:
        cells = []
        for kind in kinds:
            d = fault["detectors"][kind]
            delay = "missed" if d["first_delay"] is None else f"+{d['first_delay']}"
            cells.append(f"{d['events']}, {d['alarm_samples']}, {delay}")
        table.add_row(f"{fault['type']} {fault['start']}", *cells)
    return table
