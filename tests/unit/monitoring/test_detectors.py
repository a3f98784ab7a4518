from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from app.monitoring.detectors import (
    CusumDetector,
    Detector,
    LevelDetector,
    MahalanobisDetector,
    PointDetector,
    RollingRMSDetector,
    VarianceFloorDetector,
    cusum_kappa,
)

Form = Callable[[Detector, list[float]], list[float | None]]


def one_by_one(detector: Detector, values: list[float]) -> list[float | None]:
    """One stream, one reading per block, as a live stream of single readings."""
    state = detector.initial_state()[None]
    out: list[float | None] = []
    for value in values:
        statistic, state = detector.statistics(np.array([[value]]), state)
        out.append(None if math.isnan(statistic[0, 0]) else float(statistic[0, 0]))
    return out


def whole(detector: Detector, values: list[float]) -> list[float | None]:
    """One stream, every reading in one block, as a batch or a replay."""
    statistics, _ = detector.statistics(np.array([values]), detector.initial_state()[None])
    return [None if math.isnan(x) else float(x) for x in statistics[0]]


forms = pytest.mark.parametrize("form", [one_by_one, whole])


@forms
def test_point_is_the_absolute_residual(form: Form) -> None:
    assert form(PointDetector(threshold=1.0), [0.5, -2.0, 1.0]) == [0.5, 2.0, 1.0]


@forms
def test_rolling_rms_by_hand(form: Form) -> None:
    values = [3.0, 4.0, 0.0, 0.0, 12.0]
    got = form(RollingRMSDetector(threshold=1.0, window=3), values)
    assert got[:2] == [None, None]  # warm-up: no statistic until the window is full
    assert got[2:] == pytest.approx([math.sqrt(25 / 3), math.sqrt(16 / 3), math.sqrt(48)])


@forms
def test_variance_floor_is_the_rolling_std_and_alarms_below(form: Form) -> None:
    detector = VarianceFloorDetector(threshold=0.5, window=2)
    assert form(detector, [1.0, 3.0, 3.0, 3.0]) == [None, 1.0, 0.0, 0.0]
    assert detector.exceeds(np.array([1.0, 0.0, np.nan])).tolist() == [False, True, False]


@forms
def test_cusum_by_hand_restarts_after_signalling(form: Form) -> None:
    # increments r^2 - 1.5: 2.5, -1.5, 7.5, 7.5, -1.5; the 16 signals (limit 10) and restarts.
    detector = CusumDetector(threshold=10.0, sigma=1.0, kappa=1.5)
    assert form(detector, [2.0, 0.0, 3.0, 3.0, 0.0]) == [2.5, 1.0, 8.5, 16.0, 0.0]


@forms
def test_cusum_clip_bounds_the_evidence_of_one_reading(form: Form) -> None:
    # min(r^2, 4) - 1: a 10-sigma outlier adds 3, like a 2-sigma one; small ones are untouched.
    detector = CusumDetector(threshold=100.0, sigma=1.0, kappa=1.0, clip=4.0)
    assert form(detector, [10.0, 2.0, 0.5]) == [3.0, 6.0, 5.25]


def test_cusum_kappa_is_the_likelihood_ratio_allowance_for_doubled_variance() -> None:
    assert cusum_kappa() == pytest.approx(2 * math.log(2))
    assert 1.0 < cusum_kappa() < 1.5
    with pytest.raises(ValueError):
        cusum_kappa(1.0)


@forms
def test_level_is_the_absolute_mean_gap(form: Form) -> None:
    got = form(LevelDetector(threshold=0.5, window=3), [1.0, -1.0, 4.0, 0.5])
    assert got[:2] == [None, None]
    assert got[2:] == pytest.approx([4 / 3, 3.5 / 3])


@forms
def test_a_missing_input_is_skipped_and_the_window_holds(form: Form) -> None:
    got = form(RollingRMSDetector(threshold=1.0, window=2), [3.0, math.nan, 4.0, math.nan])
    assert got == [None, None, pytest.approx(5 / math.sqrt(2)), None]
    got = form(CusumDetector(threshold=10.0, sigma=1.0, kappa=1.0), [2.0, math.nan, 2.0])
    assert got == [3.0, None, 6.0]


def test_mahalanobis_by_hand() -> None:
    def d2(detector: MahalanobisDetector, *vectors: list[float]) -> list[float]:
        statistics, _ = detector.statistics(np.array([vectors]), np.empty((1, 0)))
        return statistics[0].tolist()

    diagonal = MahalanobisDetector(threshold=9.0, covariance=[[4.0, 0.0], [0.0, 1.0]])
    assert d2(diagonal, [2.0, 1.0]) == pytest.approx([2.0])
    correlated = MahalanobisDetector(threshold=9.0, covariance=[[1.0, 0.8], [0.8, 1.0]])
    # Sigma^-1 = [[1, -0.8], [-0.8, 1]] / 0.36: (1, -1) across the correlation gives 10, (1, 1)
    # along it 0.4 / 0.36; a vector with a missing channel has no statistic.
    got = d2(correlated, [1.0, -1.0], [1.0, 1.0], [1.0, math.nan])
    assert got[:2] == pytest.approx([10.0, 0.4 / 0.36])
    assert math.isnan(got[2])


def test_mahalanobis_refuses_a_singular_covariance() -> None:
    with pytest.raises(ValueError, match="positive definite"):
        MahalanobisDetector(threshold=1.0, covariance=[[1.0, 1.0], [1.0, 1.0]])


def make(kind: str) -> Detector:
    return {
        "point": lambda: PointDetector(threshold=2.0),
        "rolling_rms": lambda: RollingRMSDetector(threshold=1.0, window=50),
        "variance_floor": lambda: VarianceFloorDetector(threshold=0.3, window=20),
        "cusum": lambda: CusumDetector(threshold=8.0, sigma=0.9, kappa=1.3),
        "cusum_clipped": lambda: CusumDetector(threshold=8.0, sigma=0.9, kappa=1.3, clip=9.0),
        "level": lambda: LevelDetector(threshold=0.5, window=10),
    }[kind]()


@pytest.mark.parametrize(
    "kind", ["point", "rolling_rms", "variance_floor", "cusum", "cusum_clipped", "level"]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_grouping_of_streams_and_readings_never_changes_a_bit(kind: str, seed: int) -> None:
    """Many streams in one block, each stream alone reading by reading, and the block cut at
    random times: the same statistics and states, exactly (not approximately)."""
    rng = np.random.default_rng(seed)
    detector = make(kind)
    streams, readings = 9, 400
    values = rng.standard_t(3, size=(streams, readings)) * rng.uniform(1e-3, 1e3, (streams, 1))
    values[rng.random(values.shape) < 0.1] = np.nan  # missing inputs
    start = np.array([detector.initial_state() for _ in range(streams)])
    together, end = detector.statistics(values, start)

    for row in range(streams):
        state = start[row : row + 1]
        for t in range(readings):
            statistic, state = detector.statistics(values[row : row + 1, t : t + 1], state)
            assert np.array_equal(statistic[0, 0], together[row, t], equal_nan=True)
        assert np.array_equal(state[0], end[row], equal_nan=True)

    cuts = [0, *sorted(rng.choice(np.arange(1, readings), 12, replace=False).tolist()), readings]
    state, parts = start, []
    for a, b in itertools.pairwise(cuts):
        part, state = detector.statistics(values[:, a:b], state)
        parts.append(part)
    assert np.array_equal(np.concatenate(parts, axis=1), together, equal_nan=True)
    assert np.array_equal(state, end, equal_nan=True)


def test_a_rolling_state_is_the_last_inputs_padded_on_the_left() -> None:
    detector = RollingRMSDetector(threshold=1.0, window=4)
    _, state = detector.statistics(np.array([[1.0, np.nan, 2.0]]), detector.initial_state()[None])
    assert np.array_equal(state[0], [np.nan, 1.0, 2.0], equal_nan=True)  # O(window), any age
    _, state = detector.statistics(np.array([[3.0, 4.0]]), state)
    assert state[0].tolist() == [2.0, 3.0, 4.0]
    assert detector.check_state(state[0]) is None
    assert detector.check_state(np.array([1.0, np.nan, 2.0])) is not None  # a hole
    assert detector.check_state(np.array([1.0, 2.0])) is not None  # another window
    assert detector.check_state(np.array([1.0, np.inf, 2.0])) is not None


def test_cusum_state_validation() -> None:
    detector = CusumDetector(threshold=5.0, sigma=1.0, kappa=1.2)
    statistics, _ = detector.statistics(np.array([[0.0]]), np.array([[2.5]]))
    assert statistics[0, 0] == pytest.approx(1.3)
    for bad in ([-1.0], [math.inf], [], [1.0, 2.0]):
        assert detector.check_state(np.array(bad)) is not None
