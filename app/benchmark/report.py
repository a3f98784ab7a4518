"""`twinwatch evaluate benchmark`: every file of a labelled data set through twinwatch, scored.

    report = benchmark(files, learn="15%", on_file=progress)    # in-process
    report = benchmark(files, learn="400", client=ServiceClient(url))  # over HTTP

Each file's first rows (`learn`: a count or a share) are all its stream learns from; every row
after them is scored. The report holds the summed scores (`app.benchmark.scoring.summary`), each
file's, and what each stream learned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.benchmark.datasets import LabelledFile, learning_rows
from app.benchmark.runner import FileRun, run_in_process, run_over_http
from app.benchmark.scoring import FileScore, score_file, summary
from app.figures import require_matplotlib
from app.twin.client import ServiceClient


def benchmark(
    files: list[LabelledFile],
    *,
    learn: str,
    false_alarms_per_day: float = 1.0,
    client: ServiceClient | None = None,
    plots: Path | None = None,
    on_file: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    if plots is not None:
        require_matplotlib()  # before the first file, not after it
    started = time.perf_counter()
    scores: list[FileScore] = []
    per_file = []
    for labelled in files:
        rows = learning_rows(learn, labelled.rows)
        if rows >= labelled.rows:
            per_file.append({"file": labelled.name, "error": "no row left after the learning"})
            continue
        if client is None:
            run = run_in_process(labelled, rows, false_alarms_per_day=false_alarms_per_day)
        else:
            run = run_over_http(client, labelled, rows, false_alarms_per_day=false_alarms_per_day)
        scored = slice(rows, None)
        period = run.sample_period_s
        if not np.isfinite(period):
            period = float(np.median(np.diff(labelled.times))) / 1e6
        total = labelled.rows - rows
        incidents = [  # the scored rows' incidents (one that began while learning: from row 0)
            (max(0, start - rows), total if stop is None else stop - rows)
            for start, stop in run.incidents
            if stop is None or stop > rows
        ]
        score = score_file(
            labelled.name,
            labelled.times[scored] / 1e6,
            labelled.anomaly[scored],
            None if labelled.changepoint is None else labelled.changepoint[scored],
            run.alarmed[scored],
            period,
            incidents,
        )
        scores.append(score)
        per_file.append(_file_report(labelled, rows, run, score))
        if plots is not None:
            from app.benchmark.plots import plot_file  # matplotlib, on demand

            plot_file(labelled, rows, run, plots / f"{labelled.name.replace('/', '_')}.png")
        if on_file is not None:
            on_file(labelled.name)
    return {
        "learn": learn,
        "false_alarms_per_day": false_alarms_per_day,
        "where": "in-process" if client is None else client.url,
        "summary": summary(scores),
        "files": per_file,
        "seconds": time.perf_counter() - started,
    }


def _file_report(
    labelled: LabelledFile, rows: int, run: FileRun, score: FileScore
) -> dict[str, Any]:
    tp, fp, fn, tn = score.confusion
    return {
        "file": labelled.name,
        "rows": labelled.rows,
        "learning_rows": rows,
        "error": run.error,
        "sample_period_s": run.sample_period_s,
        "models": run.models,
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "anomalies": score.anomalies,
        "caught": score.caught,
        "incidents": score.incidents,
        "false_incidents": score.false_incidents,
        "delays_s": score.delays_s,
        "alarms": run.events,
    }
