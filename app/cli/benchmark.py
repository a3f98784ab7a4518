"""`twinwatch evaluate benchmark`: a labelled data set streamed through twinwatch, scored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table


def evaluate_benchmark_command(
    data: Annotated[
        Path,
        typer.Argument(
            help="A CSV file or a directory of them: a time column first, sensor columns, a 0/1 "
            "'anomaly' column and optionally 'changepoint' (SKAB's layout)."
        ),
    ],
    learn: Annotated[
        str,
        typer.Option(
            help="What each file's stream learns from: its first N rows ('400', SKAB's "
            "protocol) or a share of them ('15%'). Only these rows; every later one is scored."
        ),
    ] = "15%",
    false_alarms_per_day: Annotated[
        float, typer.Option("--false-alarms-per-day", help="Each stream's budget.", min=1e-6)
    ] = 1.0,
    url: Annotated[
        str | None,
        typer.Option(
            help="Run on the service at this URL (a stream of model auto per file, deleted "
            "after) instead of in this process."
        ),
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="TWINWATCH_API_TOKEN", help="The service's API token.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the full report (per file too) here.")
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(help="Write a PNG per file (its channels, labels and alarms) here."),
    ] = None,
) -> None:
    """Score twinwatch on a labelled data set, as a user would run it: each file's stream learns
    from its first rows only (model auto), then every later row is monitored in order.

    Prints the leaderboard's columns (SKAB's protocol: F1, false and missed alarm rates over
    all rows; the changepoint score in NAB's three profiles) and the operator's view (anomalies
    caught, incident precision, delay, false alarms a day, incidents per anomaly).
    """
    from app.benchmark.datasets import UnlabelledError, find_files, load_file
    from app.benchmark.report import benchmark
    from app.twin.client import ServiceClient

    paths = find_files(data)
    console = Console()
    client = None if url is None else ServiceClient(url, token=token)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("loading", total=len(paths))
            files, skipped = [], []
            for path in paths:
                try:
                    files.append(load_file(path, data))
                except UnlabelledError as exc:
                    skipped.append(exc.detail)
                progress.advance(task)
            if not files:
                raise UnlabelledError(f"{data}: no labelled CSV file ({'; '.join(skipped)})")
            progress.reset(task, description="streaming", total=len(files))
            report = benchmark(
                files,
                learn=learn,
                false_alarms_per_day=false_alarms_per_day,
                client=client,
                plots=plots,
                on_file=lambda _: progress.advance(task),
            )
    finally:
        if client is not None:
            client.close()
    for reason in skipped:
        console.print(f"skipped {reason}", highlight=False)
    console.print(_summary_table(report["summary"]))
    failed = [f for f in report["files"] if f.get("error")]
    for item in failed:
        console.print(f"{item['file']}: {item['error']}", highlight=False)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"wrote {json_out}", highlight=False)
    console.print(
        f"{len(files)} file(s) in {report['seconds']:.1f} s ({report['where']})", highlight=False
    )


def _number(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title="twinwatch on the data set")
    columns = ["F1", "FAR %", "MAR %", "NAB standard", "NAB LowFP", "NAB LowFN"]
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(
        _number(summary["f1"]),
        _number(summary["far_percent"]),
        _number(summary["mar_percent"]),
        _number(summary.get("nab_standard")),
        _number(summary.get("nab_low_fp")),
        _number(summary.get("nab_low_fn")),
    )
    events = summary["events"]
    table.caption = (
        f"anomalies caught {events['caught']}/{events['anomalies']}, incidents "
        f"{events['incidents']} (precision {_number(events['precision'])}), median delay "
        f"{_number(events['median_delay_s'], 0)} s, false alarms/day "
        f"{_number(events['false_alarms_per_day'])}, incidents per anomaly "
        f"{_number(events['incidents_per_anomaly'])}"
    )
    return table
