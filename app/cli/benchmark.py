"""`twinwatch evaluate benchmark`: labelled data sets streamed through twinwatch, scored beside
reference detectors."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

if TYPE_CHECKING:
    from app.benchmark.manifest import BenchmarkSet
    from app.twin.client import ServiceClient


def evaluate_benchmark_command(
    data: Annotated[
        Path | None,
        typer.Argument(
            help="A CSV file or a directory of them: a time column first, sensor columns, a 0/1 "
            "'anomaly' column and optionally 'changepoint' (SKAB's layout). A directory holding "
            "a manifest 'benchmarks.json' runs every set it lists; with --manifest, the folder "
            "its sets' paths are relative to."
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            help="A manifest of data sets ('benchmarks.json': each set's name, path, learning "
            "rows and protocol) to run one after the other; their paths are relative to DATA, "
            "or to the manifest's own folder without DATA."
        ),
    ] = None,
    learn: Annotated[
        str | None,
        typer.Option(
            help="What each file's stream learns from: its first N rows ('400', SKAB's "
            "protocol) or a share of them (default '15%'). Only these rows; every later one is "
            "scored. A manifest gives each set its own."
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            help="The changepoint score's windows: 'nab' (default: 10% of a file's scored time "
            "shared among its anomalies) or 'skab' (a fixed 60 s, SKAB's leaderboard). Over a "
            "manifest, replaces each set's protocol."
        ),
    ] = None,
    false_alarms_per_day: Annotated[
        float,
        typer.Option(
            "--false-alarms-per-day",
            help="Each stream's budget, and the reference detectors' thresholds'.",
            min=1e-6,
        ),
    ] = 1.0,
    no_references: Annotated[
        bool,
        typer.Option(
            "--no-references",
            help="Skip the reference detectors (windowed Gaussian, AR residual, Hotelling's "
            "T-squared) scored beside the service.",
        ),
    ] = False,
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
        Path | None,
        typer.Option("--json", help="Write the full report (per set and per file too) here."),
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(
            help="Write a PNG per file (its channels, labels and alarms) here, in a folder per "
            "set over a manifest."
        ),
    ] = None,
) -> None:
    """Score twinwatch on labelled data, as a user would run it: each file's stream learns from
    its first rows only (model auto), then every later row is monitored in order. Reference
    detectors learn from the same rows under the same budget and are scored alike.

    Prints a table per data set: the leaderboard's columns (SKAB's protocol: F1, false and
    missed alarm rates over all rows; the changepoint score in NAB's three profiles) and the
    operator's view (anomalies caught, incidents and their precision, delay, false alarms a
    day, files that kept their budget). A file that fails is reported and skipped; the exit
    code is non-zero only when every file failed.
    """
    from app.benchmark.manifest import BenchmarkSet, find_manifest, read_manifest
    from app.benchmark.scoring import window_rule
    from app.errors import DataError
    from app.twin.client import ServiceClient

    rule = None if window is None else window_rule(window)
    if manifest is not None:
        manifest_path: Path | None = manifest
        data_root = data  # the manifest's own folder without it
    elif data is not None:
        manifest_path, data_root = find_manifest(data), None
    else:
        raise DataError("give a data set (a CSV file or a folder of them) or --manifest")
    if manifest_path is not None:
        if learn is not None:
            raise DataError(f"{manifest_path} gives each set its own learning: drop --learn")
        sets = read_manifest(manifest_path, data_root)
        if rule is not None:
            sets = [replace(s, window=rule) for s in sets]
    else:
        assert data is not None
        sets = [BenchmarkSet("data", data, learn or "15%", rule or "nab")]

    console = Console()
    client = None if url is None else ServiceClient(url, token=token)
    started = time.perf_counter()
    reports: dict[str, dict[str, Any]] = {}
    over_sets = manifest_path is not None
    try:
        for benchmark_set in sets:
            reports[benchmark_set.name] = _run_set(
                benchmark_set,
                console=console,
                false_alarms_per_day=false_alarms_per_day,
                client=client,
                references=not no_references,
                plots=None if plots is None else plots / benchmark_set.name if over_sets else plots,
                title=benchmark_set.name if over_sets else None,
            )
    finally:
        if client is not None:
            client.close()
    if manifest_path is None:
        report = reports[sets[0].name]
    else:
        report = {
            "manifest": str(manifest_path),
            "false_alarms_per_day": false_alarms_per_day,
            "sets": reports,
            "seconds": time.perf_counter() - started,
        }
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"wrote {json_out}", highlight=False)
    files = sum(len(r["files"]) for r in reports.values())
    failed = sum(r["summary"]["failed"] for r in reports.values())
    console.print(
        f"{len(reports)} set(s), {files} file(s), {failed} failed, in "
        f"{time.perf_counter() - started:.1f} s "
        f"({'in-process' if client is None else client.url})",
        highlight=False,
    )
    if files and failed == files:
        raise typer.Exit(1)


def _run_set(
    benchmark_set: BenchmarkSet,
    *,
    console: Console,
    false_alarms_per_day: float,
    client: ServiceClient | None,
    references: bool,
    plots: Path | None,
    title: str | None,
) -> dict[str, Any]:
    """One data set loaded, run and printed; its report."""
    from app.benchmark.datasets import UnlabelledError, find_files, load_set
    from app.benchmark.reference import REFERENCES
    from app.benchmark.report import benchmark

    data = benchmark_set.path
    paths = find_files(data)
    label = f"{title}: " if title else ""
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{label}loading", total=len(paths))
        loaded = load_set(data, paths=paths, on_file=lambda _: progress.advance(task))
        if not loaded.files and not loaded.failed and title is None:
            raise UnlabelledError(f"{data}: no labelled CSV file ({'; '.join(loaded.skipped)})")
        progress.reset(task, description=f"{label}streaming", total=len(loaded.files))
        report = benchmark(
            loaded.files,
            learn=benchmark_set.learn,
            window=benchmark_set.window,
            false_alarms_per_day=false_alarms_per_day,
            client=client,
            plots=plots,
            references=REFERENCES if references else (),
            failed=loaded.failed,
            on_file=lambda _: progress.advance(task),
        )
    for reason in loaded.skipped:
        console.print(f"skipped {reason}", highlight=False)
    console.print(_set_table(report, title))
    for item in report["files"]:
        for detector, error in _errors(item):
            console.print(
                f"{item['file']} ({detector}): {error['type']}: {error['message']}",
                highlight=False,
            )
    if title is not None:
        return {
            "path": str(data),
            "sample_period_s": benchmark_set.sample_period_s,
            "note": benchmark_set.note,
            "skipped": loaded.skipped,
            **report,
        }
    return report


def _errors(item: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    errors = [("twinwatch", item["error"])] if "error" in item else []
    for name, own in (item.get("references") or {}).items():
        if "error" in own:
            errors.append((name, own["error"]))
    return errors


def _number(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _set_table(report: dict[str, Any], title: str | None) -> Table:
    table = Table(title=f"{title or 'the data set'}: twinwatch and references")
    columns = [
        "detector",
        "F1",
        "FAR %",
        "MAR %",
        "NAB std",
        "LowFP",
        "LowFN",
        "caught",
        "incidents (prec.)",
        "delay s",
        "false/day",
        "budget kept",
        "failed",
    ]
    for column in columns:
        table.add_column(column, justify="left" if column == "detector" else "right")
    rows = {"twinwatch": report["summary"], **report["summary"]["references"]}
    for name, summary in rows.items():
        events, budget = summary["events"], summary["budget"]
        table.add_row(
            name,
            _number(summary["f1"]),
            _number(summary["far_percent"]),
            _number(summary["mar_percent"]),
            _number(summary.get("nab_standard")),
            _number(summary.get("nab_low_fp")),
            _number(summary.get("nab_low_fn")),
            f"{events['caught']}/{events['anomalies']}",
            f"{events['incidents']} ({_number(events['precision'])})",
            _number(events["median_delay_s"], 0),
            _number(events["false_alarms_per_day"]),
            f"{budget['kept']}/{budget['files']}",
            str(summary["failed"]),
        )
    windows = [f["nab_window_s"] for f in report["files"] if f.get("nab_window_s") is not None]
    rule = (
        "SKAB's fixed 60 s"
        if report["window"] == "skab"
        else "NAB's rule"
        + (f", median {_number(sorted(windows)[len(windows) // 2], 0)} s" if windows else "")
    )
    files = len(report["files"])
    failed = report["summary"]["failed"]
    skipped = [
        f"{name} skipped {own['skipped']} file(s) it does not apply to"
        for name, own in report["summary"]["references"].items()
        if own["skipped"]
    ]
    table.caption = "; ".join(
        [
            f"{files} file(s), {failed} failed",
            f"learning: the first {report['learn']} of each file's rows",
            f"changepoint windows: {rule}",
            f"budget {report['false_alarms_per_day']:g} false alarm(s) a day",
            *skipped,
        ]
    )
    return table
