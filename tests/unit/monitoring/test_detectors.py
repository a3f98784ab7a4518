from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from app.errors import DataError
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


def incremental(detector: Detector, values: list[float]) -> list[float | None]:
    return [detector.update(v) for v in values]


def batch(detector: Detector, values: list[float]) -> list[float | None]:
    out = detector.batch(np.asarray(values, dtype=np.float64))
    return [None if math.isnan(x) else float(x) for x in out]


@pytest.mark.parametrize("form", [incremental, batch])
def test_point_is_the_absolute_residual(form: Form) -> None:
    assert form(PointDetector(threshold=1.0), [0.5, -2.0, 1.0]) == [0.5, 2.0, 1.0]


@pytest.mark.parametrize("form", [incremental, batch])
def test_rolling_rms_by_hand(form: Form) -> None:
    values = [3.0, 4.0, 0.0, 0.0, 12.0]
    got = form(RollingRMSDetector(threshold=1.0, window=3), values)
    assert got[:2] == [None, None]  # warm-up: no statistic until the window is full
    assert got[2:] == pytest.approx([math.sqrt(25 / 3), math.sqrt(16 / 3), math.sqrt(48)])


@pytest.mark.parametrize("form", [incremental, batch])
def test_variance_floor_is_the_rolling_std_and_alarms_below(form: Form) -> None:
    detector = VarianceFloorDetector(threshold=0.5, window=2)
    got = form(detector, [1.0, 3.0, 3.0, 3.0])
    assert got == [None, 1.0, 0.0, 0.0]
    assert not detector.exceeds(1.0) and detector.exceeds(0.0)


@pytest.mark.parametrize("form", [incremental, batch])
def test_cusum_by_hand_restarts_after_signalling(form: Form) -> None:
    # increments r^2 - 1.5: 2.5, -1.5, 7.5, 7.5, -1.5; the 16 signals (limit 10) and restarts.
    detector = CusumDetector(threshold=10.0, sigma=1.0, kappa=1.5)
    got = form(detector, [2.0, 0.0, 3.0, 3.0, 0.0])
    assert got == [2.5, 1.0, 8.5, 16.0, 0.0]


@pytest.mark.parametrize("form", [incremental, batch])
def test_cusum_clip_bounds_the_evidence_of_one_sample(form: Form) -> None:
    # min(r^2, 4) - 1: a 10-sigma outlier adds 3, like a 2-sigma one; small ones are untouched.
    detector = CusumDetector(threshold=100.0, sigma=1.0, kappa=1.0, clip=4.0)
    assert form(detector, [10.0, 2.0, 0.5]) == [3.0, 6.0, 5.25]


def test_cusum_kappa_is_the_likelihood_ratio_allowance_for_doubled_variance() -> None:
    assert cusum_kappa() == pytest.approx(2 * math.log(2))
    assert 1.0 < cusum_kappa() < 1.5
    with pytest.raises(ValueError):
        cusum_kappa(1.0)


@pytest.mark.parametrize("form", [incremental, batch])
def test_level_is_the_absolute_mean_gap(form: Form) -> None:
    got = form(LevelDetector(threshold=0.5, window=3), [1.0, -1.0, 4.0, 0.5])
    assert got[:2] == [None, None]
    assert got[2:] == pytest.approx([4 / 3, 3.5 / 3])


def test_mahalanobis_by_hand() -> None:
    diagonal = MahalanobisDetector(threshold=9.0, covariance=[[4.0, 0.0], [0.0, 1.0]])
    assert diagonal.update([2.0, 1.0]) == pytest.approx(2.0)
    correlated = MahalanobisDetector(threshold=9.0, covariance=[[1.0, 0.8], [0.8, 1.0]])
    # Sigma^-1 = [[1, -0.8], [-0.8, 1]] / 0.36, so (1, -1) gives 3.6 / 0.36 = 10 ...
    assert correlated.update([1.0, -1.0]) == pytest.approx(10.0)
    # ... while (1, 1), along the correlation, gives 0.4 / 0.36.
    assert correlated.update([1.0, 1.0]) == pytest.approx(0.4 / 0.36)
    batch_form = correlated.batch(np.array([[1.0, -1.0], [1.0, 1.0]]))
    assert batch_form.tolist() == [correlated.update([1.0, -1.0]), correlated.update([1.0, 1.0])]


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
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_equals_batch_bit_for_bit(kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_t(3, size=2000) * rng.uniform(0.1, 10)
    one = make(kind)
    stepped = [one.update(float(v)) for v in values]
    other = make(kind)
    # Batch in uneven chunks: the state carried between chunks must be exactly the stepped one.
    cuts = sorted(rng.choice(np.arange(1, 2000), size=7, replace=False).tolist())
    parts = [other.batch(chunk) for chunk in np.split(values, cuts)]
    batched = np.concatenate(parts)
    expected = np.array([np.nan if s is None else s for s in stepped])
    assert np.array_equal(batched, expected, equal_nan=True)  # exact, not approximate
    assert one.state_dict() == other.state_dict()


def test_mahalanobis_incremental_equals_batch_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    covariance = [[2.0, 0.3, -0.5], [0.3, 1.0, 0.2], [-0.5, 0.2, 0.7]]
    values = rng.multivariate_normal(np.zeros(3), covariance, size=500)
    detector = MahalanobisDetector(threshold=10.0, covariance=covariance)
    stepped = np.array([detector.update(row.tolist()) for row in values])
    assert np.array_equal(detector.batch(values), stepped)


def test_rolling_state_round_trip_and_validation() -> None:
    detector = RollingRMSDetector(threshold=1.0, window=3)
    for v in [1.0, 2.0, 3.0, 4.0]:
        detector.update(v)
    state = detector.state_dict()
    assert state == {"buffer": [2.0, 3.0, 4.0]}  # O(window) state, whatever the stream length
    restored = RollingRMSDetector(threshold=1.0, window=3)
    restored.load_state_dict(state)
    assert restored.update(5.0) == detector.update(5.0)
    with pytest.raises(DataError):
        RollingRMSDetector(threshold=1.0, window=2).load_state_dict(state)  # longer than window
    with pytest.raises(DataError):
        restored.load_state_dict({"buffer": [1.0, float("nan")]})


def test_cusum_state_validation() -> None:
    detector = CusumDetector(threshold=5.0, sigma=1.0, kappa=1.2)
    detector.load_state_dict({"s": 2.5})
    assert detector.update(0.0) == pytest.approx(1.3)
    for bad in ({"s": -1.0}, {"s": float("inf")}, {}, {"s": "x"}):
        with pytest.raises(DataError):
            detector.load_state_dict(bad)
