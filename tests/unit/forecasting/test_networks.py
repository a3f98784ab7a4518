from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from app.forecasting.networks import train_window_network
from app.forecasting.training import TrainingConfig, best_epoch


def _regression(samples: int = 256) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(samples, 4)).astype(np.float32)
    targets = (inputs @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)) * 10
    return inputs, targets.astype(np.float32)


def test_the_logged_gradient_norm_is_the_one_before_clipping() -> None:
    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    data = _regression()
    history = train_window_network(module, data, None, TrainingConfig(epochs=2, clip_norm=1e-3))
    # Clipped to 1e-3, yet the log shows how large the gradients really were.
    assert all(record["grad_norm_mean"] > 1.0 for record in history)
    assert all(np.isnan(record["val_loss"]) for record in history)
    assert best_epoch(history) == 2


def test_patience_stops_early_and_the_best_epoch_is_kept() -> None:
    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    inputs, targets = _regression()
    config = TrainingConfig(epochs=30, lr=5.0, clip_norm=100.0, patience=2)  # diverges
    history = train_window_network(module, (inputs, targets), (inputs[:64], targets[:64]), config)
    assert len(history) < 30
    best = best_epoch(history)
    assert len(history) == best + 2
    with torch.no_grad():
        kept = float(
            ((module(torch.from_numpy(inputs[:64])) - torch.from_numpy(targets[:64])) ** 2).mean()
        )
    assert kept == pytest.approx(history[best - 1]["val_loss"], rel=1e-5)


def test_the_progress_bar_is_shown_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    data = _regression(64)
    train_window_network(nn.Linear(4, 1), data, None, TrainingConfig(epochs=1), progress=True)
    assert "100%" in capsys.readouterr().err
    train_window_network(nn.Linear(4, 1), data, None, TrainingConfig(epochs=1))
    assert capsys.readouterr().err == ""


def test_on_epoch_sees_every_record() -> None:
    seen: list[dict[str, float]] = []
    history = train_window_network(
        nn.Linear(4, 1), _regression(64), None, TrainingConfig(epochs=3), on_epoch=seen.append
    )
    assert seen == history
