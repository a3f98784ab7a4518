from __future__ import annotations

import hashlib

import numpy as np
import pytest

from app.series import Series
from app.simulation import LAB_FAULTS, Fault, FaultType, TwinRun, inject_faults, simulate

# sha256 of the seed-0, 8,000-sample run (value then reference, little-endian float64). If this
# changes, the twin changed: every stored figure and model trained on it is then stale.
SEED0_SHA256 = "81ac32a75f4be20363858b796663821b1b126de76e08419661ca39984162bbdf"


def _digest(values: np.ndarray, reference: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(values.astype("<f8").tobytes())
    digest.update(reference.astype("<f8").tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def run0() -> TwinRun:
    return simulate(0, 8000)


def test_seed0_statistics_match_the_spec(run0: TwinRun) -> None:
    value = run0.value
    assert value.min() == pytest.approx(-1.00, abs=0.05)
    assert value.max() == pytest.approx(9.49, abs=0.05)
    assert value.std() == pytest.approx(2.38, abs=0.05)
    assert value[:1000].mean() == pytest.approx(0.49, abs=0.05)
    assert value[-1000:].mean() == pytest.approx(7.48, abs=0.05)


def test_seed0_reproduces_the_reference_csv_exactly(run0: TwinRun, seed0: Series) -> None:
    np.testing.assert_array_equal(run0.value, seed0.value)
    assert seed0.reference is not None
    np.testing.assert_array_equal(run0.reference, seed0.reference)
    np.testing.assert_allclose(run0.to_series().t, seed0.t, rtol=0, atol=1e-9)


def test_seed0_checksum_is_pinned(run0: TwinRun) -> None:
    assert _digest(run0.value, run0.reference) == SEED0_SHA256


def test_reference_is_a_redundant_sensor(run0: TwinRun) -> None:
    gap = run0.value - run0.reference
    # Two independent noises of 0.05: the gap has std 0.05 * sqrt(2).
    assert gap.std() == pytest.approx(0.05 * np.sqrt(2), rel=0.05)
    assert abs(gap.mean()) < 0.01


def test_oscillation_period_is_about_eleven_samples(run0: TwinRun) -> None:
    detrended = run0.displacement[1000:] - run0.displacement[1000:].mean()
    spectrum = np.abs(np.fft.rfft(detrended))
    frequencies = np.fft.rfftfreq(detrended.size)
    period = 1.0 / frequencies[1 + np.argmax(spectrum[1:])]
    assert 9 <= period <= 13


def test_lab_faults_reproduce_the_reference_faulted_csv(seed0_lab: Series) -> None:
    run = inject_faults(0, 8000, LAB_FAULTS)
    np.testing.assert_array_equal(run.value, seed0_lab.value)
    assert seed0_lab.reference is not None
    np.testing.assert_array_equal(run.reference, seed0_lab.reference)


def test_excitation_leaves_the_run_identical_before_it(run0: TwinRun) -> None:
    run = inject_faults(0, 8000, [Fault(type=FaultType.EXCITATION, start=7450, end=7750)])
    np.testing.assert_array_equal(run.value[:7450], run0.value[:7450])
    assert not np.array_equal(run.value[7450:7750], run0.value[7450:7750])
    # A machine fault: the redundant sensor sees it too.
    assert not np.array_equal(run.reference[7450:7750], run0.reference[7450:7750])


def test_sensor_faults_touch_only_the_primary_reading(run0: TwinRun) -> None:
    faults = [
        Fault(type=FaultType.SPIKE, start=100, end=101, magnitude=2.0),
        Fault(type=FaultType.OFFSET, start=200, end=210, magnitude=0.5),
        Fault(type=FaultType.STUCK, start=300, end=310),
        Fault(type=FaultType.DRIFT, start=400, end=404, magnitude=1.0),
        Fault(type=FaultType.GAIN, start=500, end=505, factor=2.0),
        Fault(type=FaultType.DROPOUT, start=600, end=603),
        Fault(type=FaultType.MISSING, start=700, end=702),
    ]
    run = inject_faults(0, 8000, faults)
    np.testing.assert_array_equal(run.reference, run0.reference)
    v, v0 = run.value, run0.value
    assert v[100] == pytest.approx(v0[100] + 2.0)
    np.testing.assert_allclose(v[200:210], v0[200:210] + 0.5)
    np.testing.assert_array_equal(v[300:310], np.full(10, v0[299]))
    np.testing.assert_allclose(v[400:404] - v0[400:404], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(v[500:505], 2.0 * v0[500:505])
    np.testing.assert_array_equal(v[600:603], 0.0)
    assert np.isnan(v[700:702]).all()
    untouched = np.ones(8000, dtype=bool)
    for fault in faults:
        untouched[fault.start : fault.end] = False
    np.testing.assert_array_equal(v[untouched], v0[untouched])
