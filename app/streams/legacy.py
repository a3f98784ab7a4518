"""Checkpoints that earlier releases wrote as JSON, read into this release's `SavedState`:
version 2 as it is, and twinwatch 0.1's (version 1: a window of readings, a flag per reading
for the imputed ones, and a stateful model's (h, c)) upgraded first."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.errors import DataError
from app.forecasting.base import Forecaster
from app.monitoring.monitor import Monitor
from app.streams.saved import SavedState


def from_json(
    saved: bytes, *, forecaster: Forecaster, monitor: Monitor, channels: int, window: int
) -> SavedState:
    """A checkpoint an earlier release wrote as JSON, for a recurrence of this forecaster, monitor,
    channel count and warm-up window."""
    try:
        loaded = json.loads(saved)
    except ValueError:
        raise DataError("stream state: neither this release's checkpoint nor JSON") from None
    if not isinstance(loaded, dict):
        raise DataError("stream state: not a JSON object")
    if loaded.get("version") == 1:
        loaded = _upgrade(
            loaded, forecaster=forecaster, monitor=monitor, channels=channels, window=window
        )
    if loaded.get("version") != 2:
        raise DataError(f"stream state version {loaded.get('version')!r} is not supported")
    saved_monitor = loaded.get("monitor")
    if isinstance(saved_monitor, dict):
        loaded["monitor"] = monitor.upgraded(saved_monitor)
    return SavedState.from_json(loaded)


def _upgrade(
    saved: Mapping[str, Any],
    *,
    forecaster: Forecaster,
    monitor: Monitor,
    channels: int,
    window: int,
) -> dict[str, Any]:
    """A state written by twinwatch 0.1: its window of readings, a flag per reading for
    the imputed ones, and a stateful model's (h, c)."""
    try:
        readings = np.asarray(saved["window"], dtype=np.float64).reshape(-1, channels)
        imputed = np.asarray(saved["imputed"], dtype=bool)
        recurrent = saved.get("recurrent")
        statistics = dict(saved.get("last_statistics") or {})
    except (KeyError, TypeError, ValueError):
        raise DataError("stream state (version 1) is malformed") from None
    context = forecaster.context
    history = np.full((context, channels), np.nan)
    kept = readings[-context:]
    history[context - len(kept) :] = kept
    marked = np.flatnonzero(imputed)
    since = window if not marked.size else len(imputed) - 1 - int(marked[-1])
    carry = forecaster.initial_carry(1)[0].astype(np.float64)
    if recurrent is not None and forecaster.carry_size:
        carry = np.concatenate((np.ravel(recurrent["h"]), np.ravel(recurrent["c"])))
    return {
        "version": 2,  # (the JSON layout it is read as)
        "samples": saved.get("samples"),
        "run": min(len(readings), window),
        "since_imputed": min(since, window),
        "missing_run": saved.get("missing_run"),
        "history": history.ravel().tolist(),
        "carry": carry.tolist(),
        "pending": saved.get("pending") or [None] * forecaster.outputs,
        "monitor": saved.get("monitor"),
        "latest": [
            saved.get("last_forecast"),
            saved.get("last_residual"),
            *(statistics.get(kind) for kind in monitor.kinds),
        ],
    }
