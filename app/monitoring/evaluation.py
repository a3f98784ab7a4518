"""Fault-injection evaluation of a monitor (SPEC section 5): delays, events, false alarms.

The forecaster runs over the record once (batched), then the monitor's batch form runs over the
residuals: the same code the live engine steps one reading at a time. An alarm counts for a fault
when its event starts inside [start, end + 20) (the lab's rule); the first `RECOVERY` samples after
each fault are neither fault nor normal. False alarms are EVENTS that start on normal samples,
counted per detector, in total, and as "any": incidents where any detector alarms, overlapping
events of different detectors merged into one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.forecasting.base import Forecaster
from app.monitoring.alarms import AlarmEvent
from app.monitoring.calibration import SECONDS_PER_DAY
from app.monitoring.detectors import FloatArray
from app.monitoring.monitor import DETECTOR_ORDER, Monitor, MonitorConfig, MonitorRun, reference_gap
from app.monitoring.residuals import one_step_residuals
from app.series import Series
from app.simulation.faults import Fault
from app.simulation.twin import simulate

DETECTION_MARGIN = 20
RECOVERY = 70


@dataclass(frozen=True)
class MonitoredRecord:
    """A record run through forecaster and monitor: residuals, statistics and all events."""

    residuals: FloatArray
    reference_gaps: FloatArray | None
    run: MonitorRun
    events: list[AlarmEvent]

    @property
    def samples(self) -> int:
        return int(self.residuals.shape[0])


def record_inputs(
    forecaster: Forecaster, series: Series, channels: Sequence[str]
) -> tuple[FloatArray, FloatArray | None]:
    """Residuals of the forecaster's target and the reading-minus-reference gaps (if any)."""
    residuals = one_step_residuals(forecaster, series.matrix(list(channels)))
    return residuals, warm_reference_gaps(series, forecaster.window)


def warm_reference_gaps(series: Series, window: int) -> FloatArray | None:
    """Reading minus reference, NaN for the first `window` samples: like the live engine, which
    feeds its monitor nothing before the stream's forecast window is warm."""
    if series.reference is None:
        return None
    gaps = np.array(reference_gap(series.value, series.reference), dtype=np.float64)
    gaps[:window] = np.nan
    return gaps


def monitor_record(
    config: MonitorConfig, residuals: FloatArray, reference_gaps: FloatArray | None
) -> MonitoredRecord:
    """Run a fresh monitor over a whole record."""
    monitor = Monitor(config)
    run = monitor.run(residuals, reference_gaps)
    return MonitoredRecord(residuals, reference_gaps, run, run.events(monitor.open_events()))


def incidents(events: Sequence[AlarmEvent], stop: int) -> list[tuple[int, int]]:
    """Events of all detectors merged where they overlap: [start, end) per incident."""
    spans = sorted((e.start, stop if e.end is None else e.end) for e in events)
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _mask(total: int, spans: Sequence[tuple[int, int]]) -> NDArray[np.bool_]:
    mask = np.zeros(total, dtype=bool)
    for start, end in spans:
        mask[max(0, start) : max(0, min(end, total))] = True
    return mask


def score_faults(
    record: MonitoredRecord,
    faults: Sequence[Fault],
    *,
    score_from: int,
    sample_period_s: float,
) -> dict[str, Any]:
    """Per fault: who caught it, events, alarm samples, delay; false alarms; precision."""
    total = record.samples
    detectors = [k for k in DETECTOR_ORDER if k in record.run.statistics]
    windows = [(f.start, f.end + DETECTION_MARGIN) for f in faults]
    in_fault = _mask(total, windows)
    normal = np.zeros(total, dtype=bool)
    normal[score_from:] = True
    normal &= ~_mask(total, [(f.start, f.end + RECOVERY) for f in faults])
    normal &= ~np.isnan(record.residuals)
    normal_samples = int(normal.sum())
    normal_days = normal_samples * sample_period_s / SECONDS_PER_DAY

    fault_reports = []
    for fault, (start, stop) in zip(faults, windows, strict=True):
        per_detector: dict[str, Any] = {}
        for kind in detectors:
            caught = [e for e in record.events if e.detector == kind and start <= e.start < stop]
            alarm_samples = int(record.run.exceeded[kind][start : min(stop, total)].sum())
            per_detector[kind] = {
                "events": len(caught),
                "alarm_samples": alarm_samples,
                "first_delay": min(e.start for e in caught) - fault.start if caught else None,
            }
        fault_reports.append(
            {
                **fault.as_json(),
                "caught_by": [k for k in detectors if per_detector[k]["events"]],
                "detectors": per_detector,
            }
        )

    false_events: dict[str, int] = {}
    precision: dict[str, float | None] = {}
    for kind in detectors:
        starts = [e.start for e in record.events if e.detector == kind]
        false_events[kind] = sum(1 for s in starts if s < total and normal[s])
        true = sum(1 for s in starts if s < total and in_fault[s])
        precision[kind] = _ratio(true, true + false_events[kind])
    merged = incidents(record.events, total)
    false_events["any"] = sum(1 for s, _ in merged if normal[s])
    true_any = sum(1 for s, _ in merged if in_fault[s])
    precision["any"] = _ratio(true_any, true_any + false_events["any"])
    false_events["total"] = sum(false_events[k] for k in detectors)
    return {
        "faults": fault_reports,
        "false_alarm_events": false_events,
        "false_alarm_events_per_day": {
            k: _per_day(v, normal_days) for k, v in false_events.items()
        },
        "normal_samples": normal_samples,
        "scored_from": score_from,
        "precision": precision,
    }


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _per_day(count: int, days: float) -> float | None:
    return count / days if days > 0 else None


def normal_day_false_alarms(
    forecaster: Forecaster,
    config: MonitorConfig,
    channels: Sequence[str],
    *,
    days: float,
    seed: int,
    sample_period_s: float = 0.1,
) -> dict[str, Any]:
    """False-alarm events per day on `days` of clean simulated operation with `seed`."""
    started = time.perf_counter()
    samples = round(days * SECONDS_PER_DAY / sample_period_s)
    series = simulate(seed, samples).to_series()
    simulated = time.perf_counter()
    residuals, gaps = record_inputs(forecaster, series, channels)
    forecast = time.perf_counter()
    record = monitor_record(config, residuals, gaps)
    watched = int((~np.isnan(residuals)).sum())
    watched_days = watched * sample_period_s / SECONDS_PER_DAY
    counts = {k: sum(1 for e in record.events if e.detector == k) for k in record.run.statistics}
    counts["any"] = len(incidents(record.events, record.samples))
    counts["total"] = sum(counts[k] for k in record.run.statistics)
    finite = residuals[~np.isnan(residuals)]
    return {
        "days": days,
        "seed": seed,
        "samples": samples,
        "false_alarm_events": counts,
        "false_alarm_events_per_day": {k: v / watched_days for k, v in counts.items()},
        "residual_std": float(np.std(finite)),
        "residual_std_first_last_tenth": [
            float(np.std(finite[: finite.shape[0] // 10])),
            float(np.std(finite[-finite.shape[0] // 10 :])),
        ],
        "events": [e.as_json() for e in record.events[:200]],
        "seconds": {
            "simulate": simulated - started,
            "forecast": forecast - simulated,
            "monitor": time.perf_counter() - forecast,
        },
    }
