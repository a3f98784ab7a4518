"""Comparing alarm events from two computations of the same stream."""

from __future__ import annotations

import pytest

from app.monitoring.alarms import AlarmEvent


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
