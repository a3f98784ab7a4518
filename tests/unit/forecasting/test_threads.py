"""The service forecasts in its thread pool's threads: none of them may keep a second OpenMP
thread spinning beside it (that doubled the service's CPU per reading)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from app.forecasting import training
from app.forecasting.training import single_threaded, use_one_thread


def test_a_forecast_in_a_new_thread_keeps_no_other_thread_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU time, not speed: the process must spend on a forecast what its thread spends.
    Without the per-thread setting, the rest of the process spent as much again."""
    monkeypatch.setattr(training, "_ONE_THREAD_FOR_GOOD", False)
    use_one_thread()  # as the service does at start-up, in its main thread
    # The stateful LSTM's shape over one request of 1,000 readings.
    lstm = torch.nn.LSTM(input_size=1, hidden_size=32, num_layers=2, batch_first=True)
    head = torch.nn.Linear(32, 1)
    inputs = torch.randn(1, 1000, 1)

    def forecasts() -> None:
        for _ in range(100):
            with single_threaded(), torch.inference_mode():
                head(lstm(inputs)[0])

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
