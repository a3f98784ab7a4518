"""The changepoint window follows the data under NAB's rule, and stays SKAB's 60 s under SKAB's."""

from __future__ import annotations

import numpy as np
import pytest

from app.benchmark.scoring import PROFILES, nab, nab_window_s, score_file, summary

A_FP, A_FN = PROFILES["standard"]


def scored_part(rows: int = 1000, period_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Times of `rows` readings and two labelled anomalies: [100, 130) and [600, 700)."""
    anomaly = np.zeros(rows, dtype=bool)
    anomaly[100:130] = anomaly[600:700] = True
    return np.arange(rows) * period_s, anomaly


def test_nab_window_is_a_tenth_of_the_scored_time_per_anomaly() -> None:
    times, anomaly = scored_part()
    assert nab_window_s("nab", times, anomaly, 1.0) == pytest.approx(0.1 * 1000 / 2)


def test_nab_window_is_at_least_one_sample_period() -> None:
    times, anomaly = scored_part(rows=1000, period_s=180.0)
    many = np.zeros(1000, dtype=bool)
    many[::2] = True  # 500 anomalies: 18,000 s / 500 = 36 s, under a period
    assert nab_window_s("nab", times, many, 180.0) == 180.0
    assert nab_window_s("nab", times, anomaly, 180.0) == pytest.approx(0.1 * 180_000 / 2)


def test_skab_window_is_sixty_seconds_whatever_the_data() -> None:
    for period in (1.0, 180.0):
        times, anomaly = scored_part(period_s=period)
        assert nab_window_s("skab", times, anomaly, period) == 60.0
    assert nab_window_s("skab", np.arange(10.0), np.zeros(10, dtype=bool), 1.0) == 60.0


def test_a_window_that_would_overlap_the_previous_one_starts_where_it_ends() -> None:
    times, anomaly = scored_part()
    window = nab_window_s("nab", times, anomaly, 1.0)  # 50 s
    both = np.zeros(1000, dtype=bool)
    both[[100, 130]] = True  # windows [100, 150] and [130, 180] -> [150, 180]
    first = np.zeros(1000, dtype=bool)
    first[100] = True
    predicted = np.zeros(1000, dtype=bool)
    predicted[145:] = True  # one change, at 145: in the first window only once truncated
    score, null, perfect = nab(times, both, predicted, window)["standard"]
    alone = nab(times, first, predicted, window)["standard"][0]
    assert (null, perfect) == (2 * A_FN, 2.0)
    assert score == pytest.approx(alone + A_FN)  # the second window is empty


def test_a_file_without_anomalies_has_no_window_only_its_false_changes_cost() -> None:
    times = np.arange(500.0)
    quiet = np.zeros(500, dtype=bool)
    changepoint = np.zeros(500, dtype=bool)
    assert nab_window_s("nab", times, quiet, 1.0) is None
    flicker = np.zeros(500, dtype=bool)
    flicker[200:210] = True  # two changes
    scored = score_file("normal", times, quiet, changepoint, flicker, 1.0, window="nab")
    assert scored.nab_window_s is None
    assert scored.nab["standard"] == pytest.approx((2 * A_FP, 0.0, 0.0))
    # Beside a file with an anomaly, it only lowers the sum.
    times, anomaly = scored_part()
    edges = np.zeros(1000, dtype=bool)
    edges[[100, 130, 600, 700]] = True
    perfect = score_file("faulty", times, anomaly, edges, edges, 1.0, window="nab")
    assert summary([perfect])["nab_standard"] > summary([perfect, scored])["nab_standard"]


def test_score_file_reports_the_window_of_its_rule() -> None:
    times, anomaly = scored_part()
    changepoint = np.zeros(1000, dtype=bool)
    alarmed = np.zeros(1000, dtype=bool)
    nab_rule = score_file("f", times, anomaly, changepoint, alarmed, 1.0, window="nab")
    skab_rule = score_file("f", times, anomaly, changepoint, alarmed, 1.0, window="skab")
    assert (nab_rule.nab_window_s, skab_rule.nab_window_s) == (50.0, 60.0)
