from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from app.errors import DataError
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.calibration import (
    MIN_EVENTS,
    DetectorSettings,
    HoldOut,
    budget_shares,
    calibrate_margins,
    calibrate_rate,
    count_events,
    rate_threshold,
)
from app.monitoring.detectors import cusum_kappa

ISOLATED = AlarmPolicy(k=1, n=1, m=1)  # every separated exceedance is its own event


def known_holdout() -> np.ndarray:
    """Alternating +-1 with one 3 at sample 500: every statistic's extreme is known by hand."""
    r = np.where(np.arange(1000) % 2 == 0, 1.0, -1.0)
    r[500] = 3.0
    return r


def test_margins_reproduce_the_lab_rules_on_a_known_holdout() -> None:
    r = known_holdout()
    gaps = 0.1 * np.where(np.arange(1000) % 3 == 0, 1.0, 0.0)
    config = calibrate_margins(HoldOut(r, gaps, description={"rows": "0:1000"}))
    thresholds = config.thresholds()
    assert thresholds["point"] == pytest.approx(4 * np.std(r))
    # RMS over 50 is largest on windows holding the 3: sqrt((49 + 9) / 50).
    assert thresholds["rolling_rms"] == pytest.approx(1.1 * np.sqrt(58 / 50))
    # Std over 20 of a +-1 window is 1 (10 of each); windows holding the 3 are wider.
    assert thresholds["variance_floor"] == pytest.approx(0.5 * 1.0)
    # CUSUM: 0 everywhere (1/sigma^2 < kappa) but at the 3: 9/sigma^2 - kappa.
    sigma = np.std(r)
    assert thresholds["cusum"] == pytest.approx(1.5 * (9 / sigma**2 - cusum_kappa()))
    # Level: |mean gap| over 10 samples is largest with 4 of the 0.1s inside: 0.04.
    assert thresholds["level"] == pytest.approx(1.1 * 0.04)
    assert config.calibration["holdout"]["rows"] == "0:1000"
    assert config.calibration["method"] == "margins"


def test_margins_without_a_reference_have_no_level_detector() -> None:
    config = calibrate_margins(HoldOut(known_holdout()))
    assert config.detector("level") is None
    assert config.detector("mahalanobis") is None


def test_margins_on_two_channels_add_mahalanobis_with_the_holdout_covariance() -> None:
    rng = np.random.default_rng(0)
    r = rng.multivariate_normal([0, 0], [[1.0, 0.7], [0.7, 2.0]], size=20000)
    config = calibrate_margins(HoldOut(r))
    mahalanobis = config.detector("mahalanobis")
    assert mahalanobis is not None and mahalanobis.kind == "mahalanobis"
    assert np.allclose(mahalanobis.covariance, [[1.0, 0.7], [0.7, 2.0]], atol=0.05)
    assert config.channels == 2


def test_too_short_a_holdout_is_refused() -> None:
    with pytest.raises(DataError, match="too short for the rolling_rms"):
        calibrate_margins(HoldOut(np.random.default_rng(1).standard_normal(30)))
    with pytest.raises(DataError, match="constant"):
        calibrate_margins(HoldOut(np.zeros(100)))


def test_rate_threshold_on_iid_data_is_the_known_quantile() -> None:
    x = np.abs(np.random.default_rng(2).standard_normal(400_000))
    found = rate_threshold(x, "above", ISOLATED, 1e-3)
    assert found.method == "empirical"
    assert found.threshold == pytest.approx(stats.halfnorm.isf(1e-3), rel=0.02)
    assert found.holdout_events <= 400


def test_rate_threshold_below_direction_uses_the_lower_tail() -> None:
    x = np.random.default_rng(3).uniform(0, 1, size=200_000)
    found = rate_threshold(x, "below", ISOLATED, 1e-3)
    assert found.threshold == pytest.approx(1e-3, rel=0.1)


def test_clustered_exceedances_are_calibrated_as_events_not_samples() -> None:
    # Each value held for 5 samples: exceedances come in clusters of 5, as in an oscillating
    # residual. 100 events in 500,000 samples is the 100th largest of the 100,000 values.
    x = np.abs(np.random.default_rng(4).standard_normal(100_000))
    held = np.repeat(x, 5)
    policy = AlarmPolicy(k=1, n=1, m=3)
    found = rate_threshold(held, "above", policy, 100 / held.shape[0])
    assert found.threshold == pytest.approx(np.sort(x)[-101], rel=0.01)
    assert count_events(held, "above", found.threshold, policy) == 100
    # Counting samples instead would have put the threshold at the 20th largest value.
    assert found.threshold < np.sort(x)[-21]


def test_gpd_extrapolation_recovers_a_known_heavy_tail() -> None:
    shape, scale = 0.25, 1.0
    x = stats.genpareto.rvs(shape, scale=scale, size=500_000, random_state=5)
    rate = 1e-7  # 0.05 expected events in the hold-out: far below what it can resolve
    found = rate_threshold(x, "above", ISOLATED, rate)
    truth = stats.genpareto.isf(rate, shape, scale=scale)  # 220.9
    assert found.method == "gpd"
    assert found.fit is not None and found.fit.shape == pytest.approx(shape, abs=0.12)
    assert found.threshold == pytest.approx(truth, rel=0.35)
    assert found.spread is not None and found.spread[0] <= found.threshold <= found.spread[1]
    assert found.holdout_events == 0


def test_calibrate_rate_says_when_the_holdout_cannot_resolve_the_rate() -> None:
    rng = np.random.default_rng(6)
    residuals = 0.13 * rng.standard_t(5, size=60_000)
    gaps = 0.07 * rng.standard_normal(60_000)
    config = calibrate_rate(HoldOut(residuals, gaps), 1.0, sample_period_s=0.1)
    calibration = config.calibration
    shares = calibration["per_detector_per_day"]
    assert shares["cusum"] == pytest.approx(0.4)
    assert shares["point"] == shares["level"] == pytest.approx(0.15)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert calibration["supported_rate_per_day"] == pytest.approx(MIN_EVENTS * 864000 / 60_000)
    assert "extrapolated with a generalised Pareto fit" in calibration["note"]
    assert all(d["method"].startswith("gpd") for d in calibration["detectors"].values())
    assert all(d["holdout_events"] == 0 for d in calibration["detectors"].values())
    margins = calibrate_margins(HoldOut(residuals, gaps)).thresholds()
    rated = config.thresholds()
    # One event per day is further out in the tail than the margins on a 100-second hold-out.
    assert rated["point"] > margins["point"]
    assert rated["cusum"] >= margins["cusum"] / 1.5  # at least the hold-out maximum
    assert rated["variance_floor"] < margins["variance_floor"] / 0.5
    assert rated["variance_floor"] > 0


def test_calibrate_rate_is_empirical_when_the_holdout_is_long_enough() -> None:
    residuals = np.random.default_rng(7).standard_normal(200_000)
    settings = DetectorSettings(alarm=AlarmPolicy(k=1, n=1, m=20))
    config = calibrate_rate(HoldOut(residuals), 4000.0, sample_period_s=0.1, settings=settings)
    # 800-1600 per detector per day = 185-370 expected events in 200,000 samples: counted, not
    # fitted.
    assert all(d["method"] == "empirical" for d in config.calibration["detectors"].values())
    budget = config.calibration["per_detector_per_day"]
    for kind, detail in config.calibration["detectors"].items():
        assert detail["holdout_events_per_day"] <= budget[kind], kind


def test_calibrate_rate_refuses_nonsense_rates() -> None:
    holdout = HoldOut(np.random.default_rng(8).standard_normal(5000))
    with pytest.raises(DataError, match="positive"):
        calibrate_rate(holdout, 0.0, sample_period_s=0.1)
    with pytest.raises(DataError, match="sample-period"):
        calibrate_rate(holdout, 1.0, sample_period_s=-1.0)


def test_budget_shares_sum_to_one_and_favour_cusum() -> None:
    assert budget_shares(["point", "rolling_rms"]) == {"point": 0.5, "rolling_rms": 0.5}
    shares = budget_shares(["point", "rolling_rms", "variance_floor", "cusum"])
    assert shares["cusum"] == pytest.approx(0.4)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert budget_shares(["cusum"]) == {"cusum": 1.0}
