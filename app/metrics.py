"""Every Prometheus metric of the service, built per app on its own registry.

A registry per app (not prometheus_client's global one) lets tests and tools build several apps
in one process. Labels are bounded: stream ids of configured streams and detector names, never
reading times or request values. Aggregates over all streams are always exported; per-stream
series as `PerStream` says (by default only alarm series where there is an alarm, so a scrape
stays small with 100,000 streams). `forget_stream` drops a deleted stream's series.

The per-stream series are plain numbers in a `StreamSeries` that ingest updates once per request,
exported by a collector at scrape time: a prometheus_client child per label set, 30 of them a
stream, each updated on every request, cost more memory and time than the stream itself (the
figures: docs/benchmarks.md, Memory).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from app.registry import ModelRegistry

REJECT_REASONS: tuple[str, ...] = (
    "invalid",  # bad value, unknown channel, non-finite number, out of order within the batch
    "conflict",  # older than the last accepted reading, or a changed value for an accepted time
    "too_large",  # more readings than max_batch
)
"""Why readings of a configured stream were rejected (the `reason` label's only values)."""

# Per-request ingest latency: from one reading (milliseconds) up to a 10,000-reading batch.
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class StreamSeries:
    """One stream's per-stream series as plain numbers (written under the stream's lock)."""

    readings: float = 0.0
    rejected: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0.0))
    alarms: dict[str, float] = field(default_factory=dict)  # detector -> alarms opened
    active: dict[str, bool] = field(default_factory=dict)  # detector -> has an open alarm
    thresholds: dict[str, float] = field(default_factory=dict)
    # The stream's last forecast, residual and statistics (NaN: none yet), read at scrape time:
    # the array is replaced, never changed, when the stream moves.
    latest: np.ndarray | None = None
    kinds: tuple[str, ...] = ()
    targets: int = 1  # channels forecast: `latest` holds their forecasts, then their residuals
    incidents: float = 0.0  # incidents opened (re-openings included)
    open_incidents: float = 0.0
    stale: bool = False
    last_arrival: float | None = None  # time.time() of its last accepted readings

    @property
    def alarming(self) -> bool:
        return True in self.active.values()

    @property
    def residual(self) -> float | None:
        """The first forecast channel's."""
        if self.latest is None or math.isnan(self.latest[self.targets]):
            return None
        return float(self.latest[self.targets])

    @property
    def statistics(self) -> dict[str, float]:
        if self.latest is None:
            return {}
        values = self.latest[2 * self.targets :].tolist()
        return {kind: x for kind, x in zip(self.kinds, values, strict=True) if x == x}

    def count_alarms(self, opened: list[str], incidents_opened: int, incidents_closed: int) -> None:
        for detector in opened:
            self.alarms[detector] = self.alarms.get(detector, 0.0) + 1
        self.incidents += incidents_opened
        self.open_incidents = max(0.0, self.open_incidents + incidents_opened - incidents_closed)

    def track(self, detectors: Iterable[str]) -> None:
        for detector in detectors:
            self.alarms.setdefault(detector, 0.0)
            self.active.setdefault(detector, False)


PerStream = Literal["none", "alarms", "all"]
"""Which per-stream series /metrics exports (TWINWATCH_METRICS_PER_STREAM):

- `none`: the aggregates only;
- `alarms` (the default): besides them, a stream's alarm series where there is something to
  say: `twinwatch_alarm_active` 1 for each open alarm, `twinwatch_alarms_total` once a
  detector has alarmed, open incidents, stale streams. A fleet of healthy streams costs
  nothing, so a scrape stays small with 100,000 streams;
- `all`: every series of every stream (forecast residual, each detector's statistic and
  threshold, readings, silence), for dashboards of a few thousand streams at most.
"""


class _StreamCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        streams = metrics.snapshot()
        yield from self._aggregates(streams)
        if metrics.per_stream == "all":
            yield from self._every_series(streams)
        elif metrics.per_stream == "alarms":
            yield from self._alarm_series(streams)

    def _aggregates(self, streams: list[tuple[str, StreamSeries]]) -> Iterator[Metric]:
        totals = self._metrics.totals
        accepted = CounterMetricFamily(
            "twinwatch_readings_accepted", "Readings accepted and processed, all streams."
        )
        accepted.add_metric([], totals.readings)
        refused = CounterMetricFamily(
            "twinwatch_readings_refused",
            "Readings of configured streams refused, by reason, all streams.",
            labels=["reason"],
        )
        for reason, count in totals.rejected.items():
            refused.add_metric([reason], count)
        opened = CounterMetricFamily(
            "twinwatch_alarms_opened",
            "Alarms opened, by detector, all streams.",
            labels=["detector"],
        )
        for detector, count in sorted(totals.alarms.items()):
            opened.add_metric([detector], count)
        incidents = CounterMetricFamily(
            "twinwatch_incidents_opened", "Incidents opened, all streams (re-openings too)."
        )
        incidents.add_metric([], totals.incidents)
        states = Counter(
            "stale" if s.stale else "alarm" if s.alarming else "ok" for _, s in streams
        )
        by_state = GaugeMetricFamily(
            "twinwatch_streams",
            "Configured streams by state: stale (silent too long), alarm (an alarm open), ok.",
            labels=["state"],
        )
        for state in ("ok", "alarm", "stale"):
            by_state.add_metric([state], states[state])
        open_incidents = GaugeMetricFamily(
            "twinwatch_incidents_open_all", "Incidents open, all streams."
        )
        open_incidents.add_metric([], sum(s.open_incidents for _, s in streams))
        yield from (accepted, refused, opened, incidents, by_state, open_incidents)

    def _families(self) -> dict[str, CounterMetricFamily | GaugeMetricFamily]:
        return {
            "alarms": CounterMetricFamily(
                "twinwatch_alarms", "Alarms opened.", labels=["stream", "detector"]
            ),
            "active": GaugeMetricFamily(
                "twinwatch_alarm_active",
                "1 while the detector has an open alarm on the stream, else 0.",
                labels=["stream", "detector"],
            ),
            "incidents": CounterMetricFamily(
                "twinwatch_incidents",
                "Incidents opened (alarms of a stream that overlap or follow closely; a "
                "re-opened incident counts again).",
                labels=["stream"],
            ),
            "open_incidents": GaugeMetricFamily(
                "twinwatch_incidents_open", "Incidents open on the stream.", labels=["stream"]
            ),
            "stale": GaugeMetricFamily(
                "twinwatch_stream_stale",
                "1 while the stream is stale (silent for longer than its stale limit), else 0.",
                labels=["stream"],
            ),
        }

    def _alarm_series(self, streams: list[tuple[str, StreamSeries]]) -> Iterator[Metric]:
        """The alarm families, only where a stream has something to say."""
        families = self._families()
        for stream, series in streams:
            for detector, count in list(series.alarms.items()):
                if count:
                    families["alarms"].add_metric([stream, detector], count)
            for detector, is_open in list(series.active.items()):
                if is_open:
                    families["active"].add_metric([stream, detector], 1.0)
            if series.incidents:
                families["incidents"].add_metric([stream], series.incidents)
            if series.open_incidents:
                families["open_incidents"].add_metric([stream], series.open_incidents)
            if series.stale:
                families["stale"].add_metric([stream], 1.0)
        yield from families.values()

    def _every_series(self, streams: list[tuple[str, StreamSeries]]) -> Iterator[Metric]:
        families = self._families()
        readings = CounterMetricFamily(
            "twinwatch_readings", "Readings accepted and processed.", labels=["stream"]
        )
        rejected = CounterMetricFamily(
            "twinwatch_readings_rejected",
            "Readings rejected, by reason (a rejected batch counts all its readings).",
            labels=["stream", "reason"],
        )
        residual = GaugeMetricFamily(
            "twinwatch_residual",
            "Last residual of the stream's target channel (reading minus forecast).",
            labels=["stream"],
        )
        statistic = GaugeMetricFamily(
            "twinwatch_detector_statistic",
            "Last statistic of each detector.",
            labels=["stream", "detector"],
        )
        threshold = GaugeMetricFamily(
            "twinwatch_detector_threshold",
            "Threshold each detector's statistic is compared with.",
            labels=["stream", "detector"],
        )
        silence = GaugeMetricFamily(
            "twinwatch_seconds_since_reading",
            "Seconds since the stream's last readings were accepted (since start-up if none).",
            labels=["stream"],
        )
        now = time.time()
        for stream, series in streams:
            readings.add_metric([stream], series.readings)
            for reason, count in list(series.rejected.items()):
                rejected.add_metric([stream, reason], count)
            if series.residual is not None:
                residual.add_metric([stream], series.residual)
            for detector, value in list(series.statistics.items()):
                statistic.add_metric([stream, detector], value)
            for detector, value in list(series.thresholds.items()):
                threshold.add_metric([stream, detector], value)
            for detector, is_open in list(series.active.items()):
                families["active"].add_metric([stream, detector], 1.0 if is_open else 0.0)
            for detector, count in list(series.alarms.items()):
                families["alarms"].add_metric([stream, detector], count)
            families["incidents"].add_metric([stream], series.incidents)
            families["open_incidents"].add_metric([stream], series.open_incidents)
            families["stale"].add_metric([stream], 1.0 if series.stale else 0.0)
            since = self._metrics.started if series.last_arrival is None else series.last_arrival
            silence.add_metric([stream], max(0.0, now - since))
        yield from (readings, rejected, residual, statistic, threshold, silence)
        yield from families.values()


@dataclass
class Totals:
    """The aggregates: counted as they happen, so a deleted stream takes nothing away."""

    readings: float = 0.0
    rejected: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0.0))
    alarms: dict[str, float] = field(default_factory=dict)
    incidents: float = 0.0


class Metrics:
    def __init__(self, per_stream: PerStream = "alarms") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.started = time.time()
        self.per_stream = per_stream
        self.totals = Totals()
        r = self.registry
        self._streams: dict[str, StreamSeries] = {}
        self._guard = threading.Lock()
        r.register(_StreamCollector(self))
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

    def track_stream(
        self,
        stream_id: str,
        detectors: Iterable[str],
        thresholds: dict[str, float] | None = None,
    ) -> StreamSeries:
        """The stream's series, created at zero (idempotent: existing values are kept)."""
        with self._guard:
            series = self._streams.get(stream_id)
            if series is None:
                series = self._streams[stream_id] = StreamSeries()
        series.track(detectors)
        if thresholds is not None:
            series.thresholds = dict(thresholds)
        return series

    def publish(
        self,
        stream_id: str,
        *,
        readings: int,
        latest: np.ndarray,
        kinds: tuple[str, ...],
        active: set[str],
        opened: list[str],
        targets: int = 1,
        incidents_opened: int = 0,
        incidents_closed: int = 0,
    ) -> None:
        """What a committed request moved: counts, and the stream's last values (`latest`: the
        forecast of each of `targets` channels, their residuals, then each of `kinds`'
        statistic, NaN where none yet)."""
        with self._guard:
            series = self._streams.get(stream_id)
            if series is None:
                series = self._streams[stream_id] = StreamSeries()
            self.totals.readings += readings
            self._count(opened, incidents_opened)
        series.readings += readings
        series.latest, series.kinds, series.targets = latest, kinds, targets
        if active or True in series.active.values():
            for detector in series.active:
                series.active[detector] = detector in active
        series.count_alarms(opened, incidents_opened, incidents_closed)
        series.stale, series.last_arrival = False, time.time()

    def _count(self, opened: list[str], incidents_opened: int) -> None:
        """Into the aggregates (under the guard)."""
        for detector in opened:
            self.totals.alarms[detector] = self.totals.alarms.get(detector, 0.0) + 1
        self.totals.incidents += incidents_opened

    def publish_alarms(
        self,
        stream_id: str,
        *,
        opened: list[str],
        incidents_opened: int = 0,
        incidents_closed: int = 0,
    ) -> None:
        """Alarms opened (their detectors) and incidents opened and closed on the stream."""
        series = self.track_stream(stream_id, ())
        with self._guard:
            self._count(opened, incidents_opened)
        series.count_alarms(opened, incidents_opened, incidents_closed)

    def publish_stale(
        self, stream_id: str, *, stale: bool, opened: int = 0, incidents_opened: int = 0
    ) -> None:
        """The stream went stale (its alarm opened: `opened` new alarm rows)."""
        self.track_stream(stream_id, ()).stale = stale
        self.publish_alarms(stream_id, opened=["stale"] * opened, incidents_opened=incidents_opened)

    def set_active(self, stream_id: str, active: Iterable[str]) -> None:
        """The stream's open alarms as its restored state has them (at start-up, and when it
        switches to what it learned: the replay's alarms were raised by no request)."""
        series = self.track_stream(stream_id, ())
        opened = set(active)
        for detector in series.active.keys() | opened:
            series.active[detector] = detector in opened

    def set_open_incidents(self, stream_id: str, count: int) -> None:
        """The stream's open incidents as the database has them (at start-up)."""
        self.track_stream(stream_id, ()).open_incidents = float(count)

    def reject(self, stream_id: str, reason: str, count: int) -> None:
        """Count refused readings of a configured stream (other ids get no series)."""
        with self._guard:
            series = self._streams.get(stream_id)
            if series is not None:
                self.totals.rejected[reason] = self.totals.rejected.get(reason, 0.0) + count
        if series is not None:
            series.rejected[reason] = series.rejected.get(reason, 0.0) + count

    def forget_stream(self, stream_id: str) -> None:
        """Drop every series of a deleted stream, so its labels do not linger forever."""
        with self._guard:
            self._streams.pop(stream_id, None)

    def snapshot(self) -> list[tuple[str, StreamSeries]]:
        with self._guard:
            return sorted(self._streams.items())

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
