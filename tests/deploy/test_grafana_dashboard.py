"""The provisioned Grafana dashboard: its queries use the service's real metric names."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric

from app.metrics import Metrics
from tests.deploy.conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "twinwatch.json"
DATASOURCE = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names() -> set[str]:
    """Every sample name the service's /metrics can carry (with every per-stream series, as the
    compose stack runs it)."""
    names = set()
    family: Metric
    for family in Metrics("all").registry.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def test_every_query_uses_metrics_the_service_exposes() -> None:
    known = exposed_names()
    for expr in expressions():
        used = set(re.findall(r"\btwinwatch_[a-z_]+", expr))
        assert used, expr
        assert used <= known, f"{expr}: unknown {used - known}"


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    joined = "\n".join(expressions())
    for metric in (
        "twinwatch_residual",
        "twinwatch_detector_statistic",
        "twinwatch_detector_threshold",
        "twinwatch_alarm_active",
        "twinwatch_alarms_total",
        "twinwatch_readings_total",
    ):
        assert metric in joined, metric
    (per_detector,) = [p for p in panels() if p.get("repeat") == "detector"]
    refs = {t["expr"].split("{")[0] for t in per_detector["targets"]}
    assert refs == {"twinwatch_detector_statistic", "twinwatch_detector_threshold"}


def test_panels_use_the_provisioned_datasource() -> None:
    (source,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in panels():
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == source["uid"]
