"""A stream's stored readings as a chart wants them: the readings, their forecasts, residuals
and detector statistics as columns, or per time bucket their least, greatest and mean. Pure:
`recomputed.history` replays the readings, this shapes the answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.streams.blocks import FloatArray


@dataclass(frozen=True)
class Buckets:
    """Time buckets of `step` microseconds that hold readings: where each starts, how many
    readings it holds, and each column's least, greatest and mean there (NaN: none)."""

    starts: np.ndarray
    counts: np.ndarray
    least: dict[str, FloatArray]
    greatest: dict[str, FloatArray]
    mean: dict[str, FloatArray]


def bucketed(times: np.ndarray, columns: dict[str, FloatArray], step: int) -> Buckets:
    """`times` (increasing, microseconds) cut into buckets of `step` from the first bucket
    boundary at or before the first time; NaN values are left out of each bucket's figures."""
    if not times.shape[0]:
        empty = {name: np.empty(0) for name in columns}
        return Buckets(np.empty(0, np.int64), np.empty(0, np.int64), empty, empty, empty)
    index = times // step
    firsts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    counts = np.diff(np.r_[firsts, times.shape[0]])
    least, greatest, mean = {}, {}, {}
    for name, column in columns.items():
        present = ~np.isnan(column)
        with np.errstate(invalid="ignore"):
            least[name] = np.fmin.reduceat(column, firsts)
            greatest[name] = np.fmax.reduceat(column, firsts)
            sums = np.add.reduceat(np.where(present, column, 0.0), firsts)
            seen = np.add.reduceat(present.astype(np.int64), firsts)
            mean[name] = np.where(seen > 0, sums / np.maximum(seen, 1), np.nan)
    return Buckets(index[firsts] * step, counts, least, greatest, mean)
