"""The service forecasts in its thread pool's threads: none of them may keep another thread
busy beside it (a spinning worker pool would double the service's CPU per reading)."""

from __future__ import annotations

import threading
import time

import numpy as np

from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig


def test_a_forecast_in_a_new_thread_keeps_no_other_thread_busy() -> None:
    """CPU time, not speed: the process must spend on a forecast what its thread spends."""
    training = np.cumsum(np.random.default_rng(0).normal(size=600))
    model = StatefulLSTMForecaster(
        window=16, training=TrainingConfig(epochs=1, batch_size=4, validation=50)
    ).fit(training)
    rows = np.cumsum(np.random.default_rng(1).normal(size=(1, 1000, 1)), axis=1)  # one request
    history = np.full((1, 1, 1), np.nan)

    def forecasts() -> None:
        for _ in range(100):
            model.advance(history, rows, model.initial_carry(1))

    forecasts()
    worker_cpu: list[float] = []

    def work() -> None:
        started = time.thread_time()
        forecasts()
        worker_cpu.append(time.thread_time() - started)

    process_started = time.process_time()
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    elsewhere = time.process_time() - process_started - worker_cpu[0]
    assert elsewhere < 0.5 * worker_cpu[0], (elsewhere, worker_cpu[0])
