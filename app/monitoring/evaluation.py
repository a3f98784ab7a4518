"""Fault-injection evaluation of a monitor: delays, events, false alarms.

A record is streamed through the stream recurrence, exactly as the live service would process
it (`stream_record`). An alarm counts for a fault when its event starts inside
[start, end + 20); the first `RECOVERY` samples after each fault are neither fault nor normal.
False alarms are EVENTS that start on normal samples, counted per detector, in total, and as
"any": incidents where any detector alarms, overlapping events of different detectors merged
into one.
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
from app.monitoring.config import DETECTOR_ORDER, MonitorConfig
from app.monitoring.detectors import FloatArray
from app.monitoring.incidents import incident_spans
from app.series import Series
from app.simulation.faults import Fault
from app.simulation.twin import simulate
from app.streams.blocks import Readings
from app.streams.recurrence import Recurrence

DETECTION_MARGIN = 20
RECOVERY = 70
BLOCK = 65_536
"""Readings streamed at a time: bounds the memory a window forecaster's windows take (W floats
a reading); the results do not depend on it."""


@dataclass(frozen=True)
class MonitoredRecord:
    """A record streamed through forecaster and monitor: residuals, statistics and all events."""

    residuals: FloatArray  # reading minus forecast, NaN where there is none
    inputs: FloatArray  # the residuals the detectors saw, NaN where they saw none
    reference_gaps: FloatArray | None  # reading minus reference, as the level detector saw it
    statistics: dict[str, FloatArray]  # detector -> statistic, NaN where none
    exceeded: dict[str, NDArray[np.bool_]]
    events: list[AlarmEvent]  # those that ended, then those still open

    @property
    def samples(self) -> int:
        return int(self.residuals.shape[0])


def stream_record(
    forecaster: Forecaster,
    config: MonitorConfig,
    series: Series,
    channels: Sequence[str],
    *,
    sample_period_s: float,
) -> MonitoredRecord:
    """The record through a fresh stream of the recurrence, from its first sample."""
    recurrence = Recurrence(forecaster, config)
    state = recurrence.new_state()
    values = series.matrix(list(channels))
    times = np.round(np.asarray(series.t, dtype=np.float64) * 1e6).astype(np.int64)
    residuals, inputs, gaps, events = [], [], [], []
    statistics: dict[str, list[FloatArray]] = {kind: [] for kind in recurrence.monitor.kinds}
    for start in range(0, len(series), BLOCK):
        part = slice(start, start + BLOCK)
        reference = None if series.reference is None else series.reference[part]
        block = recurrence.advance(
            [state], Readings.of_one(times[part], values[part], reference), [sample_period_s]
        )
        result = block.stream(0)
        residuals.append(result.residual)
        inputs.append(np.where(result.monitored, result.residual, np.nan))
        gaps.append(result.reference_gap)
        events += result.closed
        for kind, column in result.statistics.items():
            statistics[kind].append(column)
    joined = {kind: np.concatenate(parts) for kind, parts in statistics.items()}
    detectors = {detector.kind: detector for detector in recurrence.monitor.detectors}
    return MonitoredRecord(
        residuals=np.concatenate(residuals) if residuals else np.empty(0),
        inputs=np.concatenate(inputs) if inputs else np.empty(0),
        reference_gaps=np.concatenate(gaps) if series.reference is not None and gaps else None,
        statistics=joined,
        exceeded={kind: detectors[kind].exceeds(values) for kind, values in joined.items()},
        events=sorted(
            events + recurrence.monitor.open_events(state.monitor),
            key=lambda e: (e.start, DETECTOR_ORDER.index(e.detector)),
        ),
    )


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
    detectors = [k for k in DETECTOR_ORDER if k in record.statistics]
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
            alarm_samples = int(record.exceeded[kind][start : min(stop, total)].sum())
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
    merged = [(a, total if b is None else b) for a, b in incident_spans(record.events)]
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
    record = stream_record(forecaster, config, series, channels, sample_period_s=sample_period_s)
    residuals = record.residuals
    watched = int((~np.isnan(residuals)).sum())
    watched_days = watched * sample_period_s / SECONDS_PER_DAY
    counts = {k: sum(1 for e in record.events if e.detector == k) for k in record.statistics}
    counts["any"] = len(incident_spans(record.events))
    counts["total"] = sum(counts[k] for k in record.statistics)
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
            "stream": time.perf_counter() - simulated,
        },
    }
