"""Input and target scaling for neural forecasters: the one implementation training and
prediction share.

Two modes:

- ``per_window``: each window is z-scored with the TRAINING statistics and then its own last
  value is subtracted; the network forecasts the change from that last value. Written as
  ``(x - x_last) / std`` (the mean cancels), which is level invariant.
- ``global``: plain z-score with the training statistics, nothing subtracted. A drifting level
  pushes test inputs outside the training range; kept as the documented failure case.

Numerics: the service runs for days while the level drifts (values near 900 after a day), so
the subtraction of the last value and its addition back happen in float64; only the small
differences are cast to float32 for the network.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Normalisation = Literal["per_window", "global"]
NORMALISATIONS: tuple[Normalisation, ...] = ("per_window", "global")


def training_statistics(train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of the training part (T, C). A constant channel (a set-point
    that never moved) gets std 1 so it passes through unscaled instead of dividing by zero."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return mean.astype(np.float64), std.astype(np.float64)


def encode_inputs(
    windows: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: Normalisation
) -> np.ndarray:
    """(B, W, C) float64 readings -> (B, W, C) float32 network inputs."""
    centre = windows[:, -1:, :] if mode == "per_window" else mean
    scaled: np.ndarray = ((windows - centre) / std).astype(np.float32)
    return scaled


def encode_targets(
    targets: np.ndarray, windows: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: Normalisation
) -> np.ndarray:
    """(B, H) future readings of channel 0 -> (B, H) float32 training targets."""
    origin = windows[:, -1, 0:1] if mode == "per_window" else mean[0]
    scaled: np.ndarray = ((targets - origin) / std[0]).astype(np.float32)
    return scaled


def decode_outputs(
    outputs: np.ndarray, windows: np.ndarray, mean: np.ndarray, std: np.ndarray, mode: Normalisation
) -> np.ndarray:
    """(B, H) network outputs -> (B, H) float64 forecasts in reading units; inverse of
    `encode_targets`."""
    origin = windows[:, -1, 0:1] if mode == "per_window" else mean[0]
    forecast: np.ndarray = origin + outputs.astype(np.float64) * std[0]
    return forecast
