"""Whether a file kept its budget: its false incidents against a Poisson allowance."""

from __future__ import annotations

import numpy as np
import pytest

from app.benchmark.scoring import budget_check, score_file, summary


@pytest.mark.parametrize(
    ("false_incidents", "normal_days", "budget", "allowed", "kept"),
    [
        (0, 0.005, 1.0, 0, True),  # mean 0.005: the 99th percentile is 0
        (1, 0.005, 1.0, 0, False),
        (4, 1.0, 1.0, 4, True),  # mean 1: P(N <= 3) < 0.99 <= P(N <= 4)
        (5, 1.0, 1.0, 4, False),
        (18, 5.0, 2.0, 18, True),  # mean 10
        (0, 0.0, 1.0, 0, True),  # no normal row: nothing allowed, nothing false
    ],
)
def test_the_allowance_is_poissons_99th_percentile(
    false_incidents: int, normal_days: float, budget: float, allowed: int, kept: bool
) -> None:
    check = budget_check(false_incidents, normal_days, budget)
    assert (check.allowed, check.kept) == (allowed, kept)
    assert check.as_json() == {
        "allowed": allowed,
        "false_incidents": false_incidents,
        "kept": kept,
        "normal_days": normal_days,
    }


def test_a_files_budget_counts_incidents_that_start_on_normal_rows() -> None:
    rows = 1440  # a day of 1-minute rows, the last 240 labelled
    times = np.arange(rows) * 60.0
    anomaly = np.zeros(rows, dtype=bool)
    anomaly[1200:] = True
    alarmed = np.zeros(rows, dtype=bool)
    for start in range(100, 1100, 200):
        alarmed[start : start + 3] = alarmed[start + 50 : start + 53] = True  # 10 false ones
    alarmed[1210:1300] = True  # a true one
    score = score_file("f", times, anomaly, None, alarmed, 60.0, false_alarms_per_day=1.0)
    assert score.budget.normal_days == pytest.approx(1200 / 1440)
    assert (score.budget.false_incidents, score.budget.allowed) == (10, 4)  # mean 0.83
    assert not score.budget.kept
    generous = score_file("f", times, anomaly, None, alarmed, 60.0, false_alarms_per_day=6.0)
    assert (generous.budget.allowed, generous.budget.kept) == (11, True)  # mean 5
    assert summary([score, generous])["budget"] == {"files": 2, "kept": 1}
