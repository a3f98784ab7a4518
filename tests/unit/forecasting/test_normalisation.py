from __future__ import annotations

import numpy as np
import pytest

from app.forecasting.normalisation import (
    Normalisation,
    decode_outputs,
    encode_inputs,
    encode_targets,
    training_statistics,
)

MEAN = np.array([3.0, -1.0])
STD = np.array([2.0, 0.5])


@pytest.mark.parametrize("mode", ["per_window", "global"])
def test_decoding_inverts_the_target_encoding(mode: Normalisation) -> None:
    rng = np.random.default_rng(0)
    windows = rng.normal(size=(6, 5, 2)) + 900.0
    future = rng.normal(size=(6, 3)) + 900.0
    encoded = encode_targets(future, windows, MEAN, STD, mode).astype(np.float64)
    # float32 targets: the round trip is exact to float32 precision of the SCALED change.
    tolerance = 1e-6 * STD[0] * (1 if mode == "per_window" else 1000)
    np.testing.assert_allclose(
        decode_outputs(encoded, windows, MEAN, STD, mode), future, atol=tolerance
    )


def test_per_window_inputs_are_the_same_at_any_level() -> None:
    rng = np.random.default_rng(1)
    windows = rng.normal(size=(4, 8, 2))
    near_zero = encode_inputs(windows, MEAN, STD, "per_window")
    after_a_day = encode_inputs(windows + 864.0, MEAN, STD, "per_window")
    np.testing.assert_allclose(after_a_day, near_zero, atol=1e-6)
    assert np.all(near_zero[:, -1, :] == 0.0)
    assert near_zero.dtype == np.float32


def test_global_inputs_are_plain_z_scores() -> None:
    windows = np.array([[[5.0, 0.0]]])
    np.testing.assert_allclose(encode_inputs(windows, MEAN, STD, "global"), [[[1.0, 2.0]]])


def test_a_constant_channel_passes_through_unscaled() -> None:
    mean, std = training_statistics(np.array([[1.0, 7.0], [3.0, 7.0]]))
    np.testing.assert_array_equal(mean, [2.0, 7.0])
    np.testing.assert_array_equal(std, [1.0, 1.0])
