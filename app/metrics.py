"""Every Prometheus metric of the service, built per app on its own registry.

A registry per app (not prometheus_client's global one) lets tests and tools build several apps
in one process. Labels are bounded: stream ids of configured streams and detector names, never
reading times or request values; `track_stream` pre-creates a stream's label sets so dashboards
see zeros instead of gaps, and `forget_stream` drops them when the stream is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from app.registry import ModelRegistry

REJECT_REASONS: tuple[str, ...] = (
    "invalid",  # bad value, unknown channel, non-finite number, out of order within the batch
    "conflict",  # older than the last accepted reading, or a changed value for an accepted time
    "too_large",  # more readings than max_batch
)
"""Why readings of a configured stream were rejected (the `reason` label's only values)."""

# Per-request ingest latency: one reading (~1 ms) up to a 10,000-reading batch (seconds).
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.readings = Counter(
            "twinwatch_readings", "Readings accepted and processed.", ["stream"], registry=r
        )
        self.readings_rejected = Counter(
            "twinwatch_readings_rejected",
            "Readings rejected, by reason (a rejected batch counts all its readings).",
            ["stream", "reason"],
            registry=r,
        )
        self.residual = Gauge(
            "twinwatch_residual",
            "Last residual of the stream's target channel (reading minus forecast).",
            ["stream"],
            registry=r,
        )
        self.detector_statistic = Gauge(
            "twinwatch_detector_statistic",
            "Last statistic of each detector.",
            ["stream", "detector"],
            registry=r,
        )
        self.detector_threshold = Gauge(
            "twinwatch_detector_threshold",
            "Threshold each detector's statistic is compared with.",
            ["stream", "detector"],
            registry=r,
        )
        self.alarm_active = Gauge(
            "twinwatch_alarm_active",
            "1 while the detector has an open alarm on the stream, else 0.",
            ["stream", "detector"],
            registry=r,
        )
        self.alarms = Counter(
            "twinwatch_alarms", "Alarms opened.", ["stream", "detector"], registry=r
        )
        self.ingest_duration = Histogram(
            "twinwatch_ingest_duration_seconds",
            "Time to process and durably commit one readings request.",
            buckets=INGEST_BUCKETS,
            registry=r,
        )
        self.model_info = Gauge(
            "twinwatch_model_info",
            "Loaded forecasters (always 1), with their version and kind.",
            ["model", "version", "kind"],
            registry=r,
        )

    def set_models(self, registry: ModelRegistry) -> None:
        self.model_info.clear()
        for model in registry:
            self.model_info.labels(model=model.name, version=model.version, kind=model.kind).set(1)

    def track_stream(self, stream_id: str, detectors: Iterable[str]) -> None:
        """Create the stream's label sets at zero (idempotent; existing values are kept)."""
        self.readings.labels(stream=stream_id)
        for reason in REJECT_REASONS:
            self.readings_rejected.labels(stream=stream_id, reason=reason)
        for detector in detectors:
            self.alarms.labels(stream=stream_id, detector=detector)
            self.alarm_active.labels(stream=stream_id, detector=detector)

    def series(self, stream_id: str, detectors: Iterable[str]) -> StreamSeries:
        """The stream's label sets, looked up once: `labels()` costs ~4 us a call, and a
        reading updates a dozen series."""
        self.track_stream(stream_id, detectors)
        return StreamSeries(self, stream_id, list(detectors))

    def forget_stream(self, stream_id: str) -> None:
        """Drop every series of a deleted stream, so its labels do not linger forever."""
        for metric in (
            self.readings,
            self.readings_rejected,
            self.residual,
            self.detector_statistic,
            self.detector_threshold,
            self.alarm_active,
            self.alarms,
        ):
            metric.remove_by_labels({"stream": stream_id})

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class StreamSeries:
    """One stream's series, bound to their labels. Gauges that have no value yet (residual,
    statistics) are created on first use, so a stream warming up does not export zeros."""

    def __init__(self, metrics: Metrics, stream_id: str, detectors: list[str]) -> None:
        self._metrics = metrics
        self._stream = stream_id
        self.readings = metrics.readings.labels(stream=stream_id)
        self.alarm_active = {
            d: metrics.alarm_active.labels(stream=stream_id, detector=d) for d in detectors
        }
        self.alarms = {d: metrics.alarms.labels(stream=stream_id, detector=d) for d in detectors}
        self._residual: Any = None
        self._statistics: dict[str, Any] = {}

    def set_residual(self, value: float) -> None:
        if self._residual is None:
            self._residual = self._metrics.residual.labels(stream=self._stream)
        self._residual.set(value)

    def set_statistic(self, detector: str, value: float) -> None:
        child = self._statistics.get(detector)
        if child is None:
            child = self._metrics.detector_statistic.labels(stream=self._stream, detector=detector)
            self._statistics[detector] = child
        child.set(value)
