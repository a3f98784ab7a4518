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
    metrics = Metrics("all")
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
    metrics = Metrics("all")
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
    first, second = Metrics("all"), Metrics("all")
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


def test_by_default_only_alarming_streams_have_series_and_aggregates_outlive_streams() -> None:
    metrics = Metrics()
    for stream in ("a", "b", "c"):
        metrics.track_stream(stream, detectors=["point", "cusum"])
    latest = np.array([1.0, 0.1, 0.2, 0.0])
    metrics.publish(
        "b",
        readings=5,
        latest=latest,
        kinds=("point", "cusum"),
        active={"point"},
        opened=["point"],
        incidents_opened=1,
    )
    metrics.publish(
        "c", readings=3, latest=latest, kinds=("point", "cusum"), active=set(), opened=[]
    )
    metrics.reject("c", "conflict", 2)
    metrics.publish_stale("a", stale=True, opened=1, incidents_opened=1)
    found = parsed(metrics)
    assert found["twinwatch_alarm_active"] == {(("detector", "point"), ("stream", "b")): 1.0}
    assert found["twinwatch_alarms_total"] == {
        (("detector", "point"), ("stream", "b")): 1.0,
        (("detector", "stale"), ("stream", "a")): 1.0,
    }
    assert found["twinwatch_stream_stale"] == {(("stream", "a"),): 1.0}
    assert "twinwatch_readings_total" not in found and "twinwatch_residual" not in found
    assert found["twinwatch_readings_accepted_total"] == {(): 8.0}
    assert found["twinwatch_readings_refused_total"][(("reason", "conflict"),)] == 2.0
    assert found["twinwatch_alarms_opened_total"] == {
        (("detector", "point"),): 1.0,
        (("detector", "stale"),): 1.0,
    }
    assert found["twinwatch_incidents_opened_total"] == {(): 2.0}
    assert found["twinwatch_streams"] == {
        (("state", "ok"),): 1.0,
        (("state", "alarm"),): 1.0,
        (("state", "stale"),): 1.0,
    }
    metrics.forget_stream("b")  # counters of all streams never go back
    assert parsed(metrics)["twinwatch_readings_accepted_total"] == {(): 8.0}
