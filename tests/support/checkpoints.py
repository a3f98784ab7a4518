"""Checkpoints as earlier releases wrote them, for the tests that resume them."""

from __future__ import annotations

import json

import numpy as np

from app.monitoring.monitor import Monitor
from app.streams.blocks import StreamState


def twinwatch_0_1(
    state: StreamState,
    monitor: Monitor,
    window: int,
    *,
    last_forecast: float | None = None,
    last_residual: float | None = None,
) -> bytes:
    """`state` as twinwatch 0.1 saved it (state version 1): its last `window` readings, none
    imputed, and the monitor's state."""
    readings = state.history[-window:]
    return json.dumps(
        {
            "version": 1,
            "samples": state.samples,
            "window": readings.ravel().tolist(),
            "imputed": [False] * len(readings),
            "missing_run": 0,
            "pending": [None if np.isnan(x) else float(x) for x in state.pending],
            "monitor": monitor.state_to_json(state.monitor),
            "last_forecast": last_forecast,
            "last_residual": last_residual,
            "last_statistics": {},
        }
    ).encode()
