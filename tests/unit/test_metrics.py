"""Metrics: one registry per app, bounded label sets that appear and disappear with streams."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.forecasting.baselines import Naive
from app.metrics import REJECT_REASONS, Metrics
from app.registry import ModelRegistry, register


class _Artifact:
    def __init__(self, version: str) -> None:
        self.forecaster = Naive(window=4)
        self.manifest = {"version": version}
        self.directory = Path(".")


def parsed(metrics: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_names_follow_prometheus_conventions() -> None:
    metrics = Metrics()
    series = metrics.track_stream("s", detectors=["point"])
    series.latest, series.kinds = np.array([1.0, 0.1, 0.2]), ("point",)
    series.thresholds["point"] = 0.5
    metrics.ingest_duration.observe(0.004)
    names = set(parsed(metrics))
    assert {
        "twinwatch_readings_total",
        "twinwatch_readings_rejected_total",
        "twinwatch_residual",
        "twinwatch_detector_statistic",
        "twinwatch_detector_threshold",
        "twinwatch_alarm_active",
        "twinwatch_alarms_total",
        "twinwatch_ingest_duration_seconds_bucket",
        "twinwatch_ingest_duration_seconds_count",
        "twinwatch_ingest_duration_seconds_sum",
    } <= names


def test_track_then_forget_a_stream() -> None:
    metrics = Metrics()
    series = metrics.track_stream("pump-1", detectors=["point", "cusum"])
    metrics.track_stream("pump-2", detectors=["point"])
    series.readings += 7
    series.alarms["point"] += 1
    series.latest, series.kinds = np.array([1.0, 0.3, np.nan, np.nan]), ("point", "cusum")
    metrics.reject("pump-1", "conflict", 3)

    before = parsed(metrics)
    assert before["twinwatch_readings_total"][(("stream", "pump-1"),)] == 7
    assert before["twinwatch_alarms_total"][(("detector", "cusum"), ("stream", "pump-1"))] == 0
    assert before["twinwatch_alarms_total"][(("detector", "point"), ("stream", "pump-1"))] == 1
    assert len(before["twinwatch_readings_rejected_total"]) == 2 * len(REJECT_REASONS)
    rejected = before["twinwatch_readings_rejected_total"]
    assert rejected[(("reason", "conflict"), ("stream", "pump-1"))] == 3
    assert before["twinwatch_alarm_active"][(("detector", "cusum"), ("stream", "pump-1"))] == 0
    assert (("stream", "pump-2"),) not in before.get("twinwatch_residual", {})  # no value yet

    metrics.track_stream("pump-1", detectors=["point", "cusum"])  # idempotent: keeps counts
    assert parsed(metrics)["twinwatch_readings_total"][(("stream", "pump-1"),)] == 7

    metrics.forget_stream("pump-1")
    after = parsed(metrics)
    for name, series in after.items():
        if name.startswith("twinwatch_") and "model" not in name and "ingest" not in name:
            assert all(("stream", "pump-1") not in key for key in series), name
    assert after["twinwatch_readings_total"] == {(("stream", "pump-2"),): 0}


def test_apps_do_not_share_registries() -> None:
    first, second = Metrics(), Metrics()
    first.track_stream("a", detectors=["point"]).readings += 1
    assert "twinwatch_readings_total" not in parsed(second)


def test_model_info_is_replaced_on_reload() -> None:
    metrics = Metrics()
    now = datetime(2025, 1, 1, tzinfo=UTC)
    metrics.set_models(ModelRegistry({"m": register(_Artifact("1"), name="m", loaded_at=now)}))
    metrics.set_models(ModelRegistry({"m": register(_Artifact("2"), name="m", loaded_at=now)}))
    assert parsed(metrics)["twinwatch_model_info"] == {
        (("kind", "naive"), ("model", "m"), ("version", "2")): 1.0
    }
