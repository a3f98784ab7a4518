"""Why a network learned from one hour of the twin raises false alarms a whole day: its
residuals' largest 50-reading RMS in its learning hour, over a clean day and in the lab
record's excitation, beside the shipped model's (trained on a day).

    .venv/bin/python bench/twin_lstm_residuals.py [--epochs 30] [--hidden 32] [--hours 1]

The network is the learning stream's LSTM candidate (`app/learning/network.py`), trained on the
first three quarters of the learning readings as a stream trains it.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from app.forecasting.artifacts import load_model
from app.forecasting.base import Forecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.learning.network import LSTM_TRAINING
from app.monitoring.config import MissingConfig, MonitorConfig
from app.registry import SHIPPED_MODELS_DIR
from app.simulation.faults import LAB_FAULTS, inject_faults
from app.simulation.twin import simulate
from app.streams.blocks import Readings
from app.streams.recurrence import Recurrence

HOUR = 36_000
DAY = 864_000
WINDOW = 50


def residuals(forecaster: Forecaster, values: np.ndarray) -> np.ndarray:
    recurrence = Recurrence(forecaster, MonitorConfig(channels=1, detectors=[MissingConfig()]))
    times = (np.arange(values.shape[0]) * 100_000).astype(np.int64)
    readings = Readings.of_one(times, values[:, None])
    result = recurrence.advance([recurrence.new_state()], readings, [0.1]).stream(0)
    return np.nan_to_num(result.residuals[:, 0])


def largest_rms(r: np.ndarray) -> float:
    total = np.concatenate(([0.0], np.cumsum(r * r)))
    return float(np.sqrt((total[WINDOW:] - total[:-WINDOW]) / WINDOW).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=LSTM_TRAINING.epochs)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--hours", type=float, default=1.0)
    args = parser.parse_args()
    learning = round(args.hours * HOUR)
    day = simulate(1, learning + DAY).value
    lab = inject_faults(0, 8500, LAB_FAULTS).value
    training = dataclasses.replace(LSTM_TRAINING, epochs=args.epochs)
    network = StatefulLSTMForecaster(hidden=args.hidden, training=training)
    network.fit(day[:learning, None], train_end=round(0.75 * learning))
    shipped = load_model(SHIPPED_MODELS_DIR / "lstm-stateful-day-seed3").forecaster
    print(f"{'':42s} {'learned':>9s} {'shipped':>9s}")
    rows: dict[str, list[float]] = {}
    for forecaster in (network, shipped):
        on_day, on_lab = residuals(forecaster, day), residuals(forecaster, lab)
        rows.setdefault("residual RMS over the day", []).append(
            float(np.sqrt(np.mean(on_day[learning:] ** 2)))
        )
        rows.setdefault("largest 50-reading RMS, learning readings", []).append(
            largest_rms(on_day[300:learning])
        )
        rows.setdefault("largest 50-reading RMS, the day", []).append(
            largest_rms(on_day[learning:])
        )
        rows.setdefault("largest 50-reading RMS, the excitation", []).append(
            largest_rms(on_lab[7450:7800])
        )
    for name, (learned, trained) in rows.items():
        print(f"{name:42s} {learned:9.3f} {trained:9.3f}")


if __name__ == "__main__":
    main()
