"""PNG of a monitored record: the residual and every detector statistic with its threshold."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from app.monitoring.config import DETECTOR_ORDER, MonitorConfig
from app.monitoring.evaluation import MonitoredRecord
from app.simulation.faults import Fault

_TITLES = {
    "point": "point |r|",
    "rolling_rms": "rolling RMS",
    "variance_floor": "variance floor (rolling std, alarms below)",
    "cusum": "CUSUM",
    "level": "level |mean(value - reference)|",
    "mahalanobis": "Mahalanobis d²",
}


def plot_record(
    record: MonitoredRecord,
    config: MonitorConfig,
    faults: Sequence[Fault],
    path: Path,
    *,
    start: int = 0,
    stop: int | None = None,
) -> Path:
    """Residual and statistics over [start, stop), faults shaded, alarm events marked."""
    stop = record.samples if stop is None else stop
    kinds = [k for k in DETECTOR_ORDER if k in record.statistics]
    thresholds = config.thresholds()
    x = np.arange(start, stop)
    # The object API, not pyplot: no global figure state, safe outside the main thread.
    figure = Figure(figsize=(12, 1.9 * (len(kinds) + 1)))
    axes = figure.subplots(len(kinds) + 1, 1, sharex=True, squeeze=False)
    panels = axes[:, 0]
    panels[0].plot(x, record.residuals[start:stop], lw=0.6, color="black")
    panels[0].set_ylabel("residual")
    for panel, kind in zip(panels[1:], kinds, strict=True):
        panel.plot(x, record.statistics[kind][start:stop], lw=0.7, color="tab:blue")
        panel.axhline(thresholds[kind], color="tab:red", lw=0.9, ls="--", label="threshold")
        panel.set_title(_TITLES[kind], fontsize=8, loc="left")  # (its name: no y label too)
        if kind == "cusum":
            panel.set_yscale("symlog", linthresh=max(thresholds[kind], 1e-6))
        for event in record.events:
            if event.detector == kind:
                end = stop if event.end is None else event.end
                if end > start and event.start < stop:
                    panel.axvspan(max(event.start, start), min(end, stop), color="red", alpha=0.25)
    for panel in panels:
        for fault in faults:
            if fault.end > start and fault.start < stop:
                panel.axvspan(fault.start, fault.end, color="orange", alpha=0.2, lw=0)
    for fault in faults:
        if start <= fault.start < stop:
            panels[0].annotate(
                fault.type.value,
                (fault.start, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                va="bottom",
            )
    panels[-1].set_xlabel("sample")
    figure.legend(
        handles=[
            Line2D([], [], color="black", lw=0.6, label="residual"),
            Line2D([], [], color="tab:blue", lw=0.7, label="detector statistic"),
            Line2D([], [], color="tab:red", lw=0.9, ls="--", label="its threshold"),
            Patch(color="red", alpha=0.25, label="alarm open"),
            Patch(color="orange", alpha=0.2, label="fault"),
        ],
        loc="upper right",
        ncols=5,
        fontsize=8,
        frameon=False,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.97))  # room for the legend above
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
