"""SKAB's protocol and the operator's view, on small cases worked out by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.benchmark.datasets import channel_name, learning_rows, load_file
from app.benchmark.scoring import nab, runs, score_file, summary
from app.errors import DataError


def test_runs() -> None:
    assert runs(np.array([0, 1, 1, 0, 1])) == [(1, 3), (4, 5)]
    assert runs(np.zeros(3)) == []


def test_outlier_scores_sum_the_confusion_over_files() -> None:
    times = np.arange(10.0)
    label = np.array([0, 0, 0, 1, 1, 1, 1, 0, 0, 0])
    alarm = np.array([0, 1, 0, 0, 1, 1, 1, 1, 0, 0])
    one = score_file("a", times, label, None, alarm, 1.0)
    assert one.confusion == (3, 2, 1, 4)  # TP, FP, FN, TN
    both = summary([one, one])
    assert both["f1"] == pytest.approx(6 / (6 + (4 + 2) / 2))
    assert both["far_percent"] == pytest.approx(100 * 4 / 12)
    assert both["mar_percent"] == pytest.approx(100 * 2 / 8)
    events = both["events"]
    assert (events["anomalies"], events["caught"], events["incidents"]) == (2, 2, 4)
    assert events["median_delay_s"] == 1.0  # alarmed from the anomaly's second row
    assert events["false_incidents"] == 2


def test_nab_credits_the_first_change_in_a_window_and_charges_the_others() -> None:
    times = np.arange(200.0)
    changepoint = np.zeros(200, dtype=bool)
    changepoint[50] = True
    at_once = np.zeros(200, dtype=bool)
    at_once[50:120] = True  # changes at 50 (in the window) and 120 (outside: A_fp)
    score, null, perfect = nab(times, changepoint, at_once)["standard"]
    assert (null, perfect) == (-1.0, 1.0)
    assert score == pytest.approx(1.0 - 0.11)
    nothing = nab(times, changepoint, np.zeros(200, dtype=bool))["standard"][0]
    assert nothing == -1.0
    late = np.zeros(200, dtype=bool)
    late[110:] = True  # the window [50, 110] ends at the change: about A_fp
    assert nab(times, changepoint, late)["standard"][0] == pytest.approx(-0.11, abs=0.01)
    # Normalised: null 0, perfect 100.
    scored = score_file("a", times, np.zeros(200), changepoint, at_once, 1.0, window="skab")
    assert summary([scored])["nab_standard"] == pytest.approx(100 * (0.89 + 1) / 2)


def test_a_labelled_csv_loads_with_skabs_layout(tmp_path: Path) -> None:
    path = tmp_path / "0.csv"
    path.write_text(
        "datetime;Volume Flow RateRMS;Current;anomaly;changepoint\n"
        "2020-03-09 10:14:33;32.0;1.3;0.0;0.0\n"
        "2020-03-09 10:14:34;;1.4;1.0;1.0\n"
    )
    loaded = load_file(path, tmp_path)
    assert loaded.channels == ["Volume_Flow_RateRMS", "Current"]
    assert loaded.times[1] - loaded.times[0] == 1_000_000
    assert np.isnan(loaded.values[1, 0]) and loaded.anomaly.tolist() == [False, True]
    assert loaded.changepoint is not None and loaded.changepoint.tolist() == [False, True]


def test_learning_rows_and_names() -> None:
    assert learning_rows("400", 1000) == 400
    assert learning_rows("15%", 1000) == 150
    with pytest.raises(DataError):
        learning_rows("lots", 1000)
    taken: set[str] = set()
    assert channel_name("a b", taken) == "a_b"
    assert channel_name("a b", taken) == "a_b_2"
    assert channel_name("1st", taken) == "_1st"
