"""`twinwatch evaluate benchmark`: every file of a labelled data set through twinwatch, scored
beside the reference detectors (app/benchmark/reference.py).

    report = benchmark(files, learn="15%", on_file=progress)    # in-process
    report = benchmark(files, learn="400", client=ServiceClient(url))  # over HTTP

Each file's first rows (`learn`: a count or a share) are all its stream learns from; every row
after them is scored, for the service and for each reference alike (`score_run`). The report
holds the summed scores (`app.benchmark.scoring.summary`, the references' under
`summary["references"]`), each file's, and what each stream learned.

A file that fails (it does not parse, its stream cannot learn or take it, a detector raises) is
that file's error, its type and message in its entry; the run goes on, and every summary counts
the files it could not score (`failed`) beside those it scored. References run on every file
the set loaded, whether the service could take it or not; one that does not apply to a file
(Hotelling's T^2 to a single channel) counts it as `skipped`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.benchmark.datasets import LabelledFile, learning_rows
from app.benchmark.reference import REFERENCES, Reference
from app.benchmark.runner import FileRun, run_in_process, run_over_http, run_reference
from app.benchmark.scoring import FileScore, WindowRule, score_file, summary
from app.errors import AppError, DataError
from app.figures import require_matplotlib
from app.twin.client import ServiceClient


def error_entry(exc: BaseException) -> dict[str, str]:
    """What a file's failure is reported as."""
    message = exc.detail if isinstance(exc, AppError) else str(exc)
    return {"type": type(exc).__name__, "message": message}


def score_run(
    labelled: LabelledFile,
    learn_rows: int,
    run: FileRun,
    *,
    window: WindowRule,
    false_alarms_per_day: float,
) -> FileScore:
    """A run's alarm state and incidents on the file's scored rows (those after the learning)."""
    scored = slice(learn_rows, None)
    period = run.sample_period_s
    if not np.isfinite(period):
        period = float(np.median(np.diff(labelled.times))) / 1e6
    total = labelled.rows - learn_rows
    incidents = [  # the scored rows' incidents (one that began while learning: from row 0)
        (max(0, start - learn_rows), total if stop is None else stop - learn_rows)
        for start, stop in run.incidents
        if stop is None or stop > learn_rows
    ]
    return score_file(
        labelled.name,
        labelled.times[scored] / 1e6,
        labelled.anomaly[scored],
        None if labelled.changepoint is None else labelled.changepoint[scored],
        run.alarmed[scored],
        period,
        incidents,
        window=window,
        false_alarms_per_day=false_alarms_per_day,
    )


def benchmark(
    files: list[LabelledFile],
    *,
    learn: str,
    window: WindowRule = "nab",
    false_alarms_per_day: float = 1.0,
    client: ServiceClient | None = None,
    plots: Path | None = None,
    references: Sequence[Reference] = REFERENCES,
    failed: Sequence[tuple[str, Exception]] = (),
    on_file: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One data set's report. `failed`: files that did not load (name, error), reported as
    failed for every detector; `references=()` runs the service alone."""
    if plots is not None:
        require_matplotlib()  # before the first file, not after it
    started = time.perf_counter()
    scores: list[FileScore] = []
    reference_scores: dict[str, list[FileScore]] = {r.name: [] for r in references}
    reference_failed = dict.fromkeys(reference_scores, len(failed))
    reference_skipped = dict.fromkeys(reference_scores, 0)
    per_file: list[dict[str, Any]] = [
        {"file": name, "error": error_entry(exc)} for name, exc in failed
    ]
    for labelled in files:
        rows = learning_rows(learn, labelled.rows)
        entry: dict[str, Any] = {
            "file": labelled.name,
            "rows": labelled.rows,
            "learning_rows": rows,
        }
        per_file.append(entry)
        if rows >= labelled.rows:
            entry["error"] = error_entry(DataError("no row left after the learning"))
            for name in reference_failed:
                reference_failed[name] += 1
            continue
        try:
            if client is None:
                run = run_in_process(labelled, rows, false_alarms_per_day=false_alarms_per_day)
            else:
                run = run_over_http(
                    client, labelled, rows, false_alarms_per_day=false_alarms_per_day
                )
            score = score_run(
                labelled, rows, run, window=window, false_alarms_per_day=false_alarms_per_day
            )
        except Exception as exc:  # one file's failure, never the run's
            entry["error"] = error_entry(exc)
        else:
            scores.append(score)
            entry.update(_file_report(run, score))
            if plots is not None:
                from app.benchmark.plots import plot_file  # matplotlib, on demand

                plot_file(labelled, rows, run, plots / f"{labelled.name.replace('/', '_')}.png")
        entry["references"] = {}
        for reference in references:
            if labelled.values.shape[1] < reference.min_channels:
                entry["references"][reference.name] = {
                    "skipped": f"needs {reference.min_channels} channels or more"
                }
                reference_skipped[reference.name] += 1
                continue
            try:
                own = run_reference(
                    reference, labelled, rows, false_alarms_per_day=false_alarms_per_day
                )
                own_score = score_run(
                    labelled, rows, own, window=window, false_alarms_per_day=false_alarms_per_day
                )
            except Exception as exc:  # as for the service: this file's, this detector's
                entry["references"][reference.name] = {"error": error_entry(exc)}
                reference_failed[reference.name] += 1
                continue
            reference_scores[reference.name].append(own_score)
            entry["references"][reference.name] = {
                "threshold": own.threshold,
                **_score_report(own_score),
            }
        if on_file is not None:
            on_file(labelled.name)
    total = summary(scores)
    total["failed"] = sum(1 for entry in per_file if "error" in entry)
    total["references"] = {
        name: {**summary(own), "failed": reference_failed[name], "skipped": reference_skipped[name]}
        for name, own in reference_scores.items()
    }
    return {
        "learn": learn,
        "window": window,
        "false_alarms_per_day": false_alarms_per_day,
        "where": "in-process" if client is None else client.url,
        "summary": total,
        "files": per_file,
        "seconds": time.perf_counter() - started,
    }


def _score_report(score: FileScore) -> dict[str, Any]:
    tp, fp, fn, tn = score.confusion
    return {
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "anomalies": score.anomalies,
        "caught": score.caught,
        "incidents": score.incidents,
        "false_incidents": score.false_incidents,
        "delays_s": score.delays_s,
        "nab_window_s": score.nab_window_s,
        "budget": score.budget.as_json(),
    }


def _file_report(run: FileRun, score: FileScore) -> dict[str, Any]:
    return {
        "sample_period_s": run.sample_period_s,
        "models": run.models,
        **_score_report(score),
        "alarms": run.events,
    }
