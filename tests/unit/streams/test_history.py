from __future__ import annotations

import numpy as np

from app.streams.history import bucketed


def test_buckets_hold_the_least_greatest_and_mean_of_their_numbers() -> None:
    times = np.array([0, 4, 10, 12, 19, 45], dtype=np.int64)
    values = np.array([1.0, 3.0, np.nan, 5.0, 7.0, np.nan])
    cut = bucketed(times, {"value": values}, step=10)
    assert cut.starts.tolist() == [0, 10, 40]  # the empty buckets are left out
    assert cut.counts.tolist() == [2, 3, 1]
    assert cut.least["value"].tolist()[:2] == [1.0, 5.0]
    assert cut.greatest["value"].tolist()[:2] == [3.0, 7.0]
    assert cut.mean["value"].tolist()[:2] == [2.0, 6.0]
    assert np.isnan(cut.least["value"][2]) and np.isnan(cut.mean["value"][2])  # no number


def test_no_readings_no_buckets() -> None:
    cut = bucketed(np.empty(0, np.int64), {"value": np.empty(0)}, step=10)
    assert cut.starts.size == 0 and cut.mean["value"].size == 0
