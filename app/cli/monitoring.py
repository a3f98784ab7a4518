"""`twinwatch calibrate` (detector thresholds) and `twinwatch evaluate monitor` (detection)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from app.errors import DataError
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.calibration import Margins
from app.monitoring.config import DETECTOR_ORDER, MonitorConfig

_MARGINS = Margins()
DEFAULT_THRESHOLDS = (
    f"point: {_MARGINS.point_sigmas:g} standard deviations of the hold-out residuals; "
    f"rolling RMS: {_MARGINS.rms_factor:g} times its hold-out maximum; variance floor: "
    f"{_MARGINS.floor_factor:g} times its hold-out minimum; CUSUM: {_MARGINS.cusum_factor:g}, "
    f"level: {_MARGINS.level_factor:g} and Mahalanobis: {_MARGINS.mahalanobis_factor:g} times "
    "their hold-out maximum"
)
"""The margins calibration uses without a target rate, in words for the help."""

ModelOption = Annotated[Path, typer.Option("--model", help="Model directory (models/NAME).")]


def _directory_or_shipped(model: Path) -> Path:
    """A model directory, or the name of a model shipped with twinwatch."""
    from app.registry import SHIPPED_MODELS_DIR

    shipped = SHIPPED_MODELS_DIR / model.name
    if not model.exists() and model.name == str(model) and shipped.is_dir():
        return shipped
    return model


ReadModelOption = Annotated[
    Path,
    typer.Option(
        "--model",
        callback=_directory_or_shipped,
        help="Model directory (models/NAME), or the name of a model shipped with twinwatch "
        "(lstm-stateful-day-seed3, lstm-day-seed3, lstm-seed0).",
    ),
]
DataOption = Annotated[
    Path,
    typer.Option("--data", help="CSV t,value[,reference]: one row per sample, uniformly spaced."),
]
PeriodOption = Annotated[
    float | None,
    typer.Option(
        "--sample-period",
        help="Seconds between samples, for rates per day (default: the spacing of t in --data).",
    ),
]


def alarm_policy(*, open_after: int, open_window: int, close_after: int) -> AlarmPolicy:
    """The alarm rule of the options; a refusal names the options the user typed."""
    try:
        return AlarmPolicy(k=open_after, n=open_window, m=close_after)
    except ValidationError:
        raise DataError(
            f"alarm rule --open-after {open_after} --open-window {open_window} --close-after "
            f"{close_after}: each must be at least 1, and --open-after cannot exceed --open-window"
        ) from None


def calibrate_command(
    model: ModelOption,
    data: DataOption,
    holdout: Annotated[
        str,
        typer.Option(
            help="Samples START:STOP of --data (sample indices, STOP excluded) of normal "
            "operation the model never trained on; 'all' for a separate file of it."
        ),
    ],
    false_alarms_per_day: Annotated[
        float | None,
        typer.Option(
            "--false-alarms-per-day",
            help="Target false-alarm events per day, all detectors together. Without it, "
            f"each threshold is a margin over the hold-out: {DEFAULT_THRESHOLDS}.",
        ),
    ] = None,
    sample_period: PeriodOption = None,
    open_after: Annotated[
        int,
        typer.Option(
            metavar="EXCEEDANCES",
            help="Exceedances of the threshold that open an alarm, counted over the last "
            "--open-window samples.",
        ),
    ] = 1,
    open_window: Annotated[
        int,
        typer.Option(
            metavar="SAMPLES",
            help="Samples over which --open-after counts exceedances (1: every exceedance opens "
            "an alarm).",
        ),
    ] = 1,
    close_after: Annotated[
        int,
        typer.Option(
            metavar="SAMPLES",
            help="Consecutive samples back inside the threshold that close an open alarm.",
        ),
    ] = 20,
) -> None:
    """Set every detector's threshold from held-out normal data; store them in the manifest.

    The model forecasts the hold-out; each detector's threshold comes from its statistic over
    the residuals there, either as a margin or for a target false-alarm rate. The alarm rule
    (--open-after, --open-window, --close-after) is stored with them.
    """
    from app.monitoring.workflow import calibrate  # scipy, matplotlib: not at CLI start-up

    config = calibrate(
        model,
        data,
        holdout,
        false_alarms_per_day=false_alarms_per_day,
        sample_period_s=sample_period,
        alarm=alarm_policy(open_after=open_after, open_window=open_window, close_after=close_after),
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


def evaluate_monitor_command(
    model: ReadModelOption,
    data: DataOption,
    faults: Annotated[
        Path,
        typer.Option(
            "--faults", help="The faults of --data, a JSON list as twinwatch simulate writes it."
        ),
    ],
    json_out: Annotated[Path, typer.Option("--json", help="Write the JSON report to this file.")],
    holdout: Annotated[
        str | None,
        typer.Option(
            help="Set the thresholds here from normal samples START:STOP of --data, as margins "
            f"over them ({DEFAULT_THRESHOLDS}). Default: the thresholds in the model's manifest."
        ),
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(
            help="Write a PNG of the record, its statistics and alarms to this directory."
        ),
    ] = None,
    normal_days: Annotated[
        float | None,
        typer.Option(
            "--normal-days",
            help="Also simulate this many days of clean operation (with --seed) and count their "
            "false alarms.",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the clean simulated days; pick one the model never trained on."),
    ] = None,
    sample_period: PeriodOption = None,
) -> None:
    """Score the detectors on a record with known faults.

    Per fault: which detectors alarmed, their events and alarm samples, and the first alarm's
    delay in samples. On the samples outside the faults: false-alarm events per day, and the
    precision of the alarms.
    """
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
