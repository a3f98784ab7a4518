"""Residual monitoring (SPEC section 5): detectors, alarm events, calibration, evaluation.

The live engine builds one `Monitor` per stream from the thresholds in a model's manifest and
steps it one reading at a time; the offline evaluation runs the same monitor in batch.
"""

from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.monitor import Monitor, MonitorConfig, MonitorRun, MonitorStep, reference_gap

__all__ = [
    "AlarmEvent",
    "AlarmPolicy",
    "Monitor",
    "MonitorConfig",
    "MonitorRun",
    "MonitorStep",
    "reference_gap",
]
