"""Tiny labelled files for the benchmark's tests: two smooth channels (a sine and a cosine with a
little bounded noise, so no reading is an outlier by chance) and one labelled anomaly."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from app.benchmark.datasets import LabelledFile

EPOCH_2024_S = 1_704_067_200


def readings(
    rows: int, *, channels: int = 2, spike_at: int | None = None, seed: int = 0
) -> np.ndarray:
    """(rows, channels): phase-shifted sines, noise in ±0.05, +5 on channel 0 at `spike_at`."""
    rng = np.random.default_rng(seed)
    phase = np.arange(rows)[:, None] * 2 * np.pi / 50 + np.arange(channels)[None, :] * np.pi / 2
    values = np.sin(phase) + rng.uniform(-0.05, 0.05, size=(rows, channels))
    if spike_at is not None:
        values[spike_at, 0] += 5.0
    return values


def labelled_file(
    name: str,
    rows: int = 300,
    *,
    anomaly: tuple[int, int] | None = (220, 240),
    channels: int = 2,
    period_s: int = 60,
) -> LabelledFile:
    """A file whose anomaly [start, stop) is a level shift of +4 on channel 0."""
    values = readings(rows, channels=channels)
    label = np.zeros(rows, dtype=bool)
    changepoint = np.zeros(rows, dtype=bool)
    if anomaly is not None:
        start, stop = anomaly
        values[start:stop, 0] += 4.0
        label[start:stop] = True
        changepoint[[start, stop]] = True
    times = (np.arange(rows, dtype=np.int64) * period_s + EPOCH_2024_S) * 1_000_000
    return LabelledFile(name, times, values, [f"c{i}" for i in range(channels)], label, changepoint)


def write_csv(path: Path, labelled: LabelledFile) -> Path:
    """`labelled` in SKAB's layout (`;`, an ISO time column, labels last); NaN as empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ["datetime", *labelled.channels, "anomaly", "changepoint"]
    assert labelled.changepoint is not None
    lines = [";".join(header)]
    for t, row, a, c in zip(
        labelled.times, labelled.values, labelled.anomaly, labelled.changepoint, strict=True
    ):
        moment = datetime.fromtimestamp(int(t) / 1e6, UTC)
        numbers = ["" if np.isnan(v) else f"{v:.6f}" for v in row]
        lines.append(
            ";".join([moment.strftime("%Y-%m-%d %H:%M:%S"), *numbers, str(int(a)), str(int(c))])
        )
    path.write_text("\n".join(lines) + "\n")
    return path
