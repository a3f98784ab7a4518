"""Streaming a record through a processor, and comparing the alarms of two computations."""

from __future__ import annotations

import numpy as np
import pytest

from app.monitoring.alarms import AlarmEvent
from app.streams.processor import StreamProcessor, StreamState


def same_events(
    a: list[AlarmEvent], b: list[AlarmEvent], *, rel: float = 1e-9, abs: float = 0.0
) -> bool:
    """Same detectors, samples and thresholds; peaks within float noise of the forecasts."""

    def key(e: AlarmEvent) -> tuple[int, str]:
        return (e.start, e.detector)

    a, b = sorted(a, key=key), sorted(b, key=key)
    return len(a) == len(b) and all(
        (x.detector, x.start, x.end, x.cleared_at, x.threshold)
        == (y.detector, y.start, y.end, y.cleared_at, y.threshold)
        and x.peak == pytest.approx(y.peak, rel=rel, abs=abs)
        for x, y in zip(a, b, strict=True)
    )


def stream(
    processor: StreamProcessor, values: np.ndarray, references: np.ndarray, size: int
) -> tuple[StreamState, np.ndarray, list[AlarmEvent]]:
    """A fresh stream fed `values` in batches of `size`: its final state, every residual and
    every alarm event (closed ones, then those still open)."""
    state = processor.new_state()
    residuals, events = [], []
    for start in range(0, values.size, size):
        result = processor.advance(
            state, values[start : start + size, None], references[start : start + size]
        )
        residuals.append(result.residual)
        events.extend(result.closed)
    events.extend(state.monitor.open_events())
    return state, np.concatenate(residuals), events
