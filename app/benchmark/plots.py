"""A PNG per benchmark file: each channel, the labelled anomalies and the alarm state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from app.benchmark.datasets import LabelledFile
from app.benchmark.runner import FileRun
from app.benchmark.scoring import runs


def plot_file(labelled: LabelledFile, learn_rows: int, run: FileRun, path: Path) -> None:
    channels = labelled.values.shape[1]
    figure = Figure(figsize=(12, 1.4 * channels + 1.2), layout="constrained")
    axes = figure.subplots(channels + 1, 1, sharex=True, squeeze=False)[:, 0]
    rows = np.arange(labelled.rows)
    for axis, name, column in zip(axes, labelled.channels, labelled.values.T, strict=False):
        axis.plot(rows, column, lw=0.6, color="black")
        axis.set_ylabel(name, rotation=0, ha="right", fontsize=8)
        for start, stop in runs(labelled.anomaly):
            axis.axvspan(start, stop, color="tab:orange", alpha=0.2, lw=0)
        axis.axvline(learn_rows, color="tab:blue", lw=0.8)
    state = axes[-1]
    state.fill_between(rows, run.alarmed.astype(float), step="post", color="tab:red", alpha=0.6)
    state.fill_between(
        rows, -labelled.anomaly.astype(float), step="post", color="tab:orange", alpha=0.6
    )
    state.set_ylabel("alarm (up)\nlabel (down)", rotation=0, ha="right", fontsize=8)
    state.set_xlabel("row (learning left of the blue line)")
    figure.suptitle(labelled.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
