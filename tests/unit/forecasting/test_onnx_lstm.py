"""ONNX Runtime's LSTM kernel computes the stateful network's recurrence as torch does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.forecasting.onnx_lstm import OnnxLSTM
from app.forecasting.stateful_lstm import StatefulNetwork


@pytest.mark.parametrize(
    ("channels", "hidden", "layers", "horizon", "steps", "streams"),
    [(1, 32, 2, 1, 1000, 1), (3, 8, 1, 4, 7, 5), (2, 16, 3, 2, 1, 64)],
)
def test_the_onnx_recurrence_agrees_with_torchs(
    channels: int, hidden: int, layers: int, horizon: int, steps: int, streams: int
) -> None:
    """Every layer count, input width, horizon, length and batch: the same outputs and final
    state within float32 rounding, from a non-zero state and with saturating gates."""
    torch.manual_seed(layers)
    module = StatefulNetwork(
        n_channels=channels, hidden=hidden, layers=layers, dropout=0.1, horizon=horizon
    ).eval()
    rng = np.random.default_rng(hidden)
    x = rng.normal(scale=3.0, size=(steps, streams, channels)).astype(np.float32)
    x[steps // 2] *= 30.0  # saturating gates
    h = rng.normal(size=(layers, streams, hidden)).astype(np.float32)
    c = rng.normal(size=(layers, streams, hidden)).astype(np.float32)
    out, h_last, c_last = OnnxLSTM.of(module).sequence(x, h, c)
    with torch.inference_mode():
        start = (torch.from_numpy(h), torch.from_numpy(c))
        expected, (h_torch, c_torch) = module.sequence(torch.from_numpy(x).transpose(0, 1), start)
    assert out.shape == (steps, streams, horizon) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected.transpose(0, 1).numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(h_last, h_torch.numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(c_last, c_torch.numpy(), rtol=0, atol=1e-5)
