"""The OpenAPI document: what client generators and the /docs page rely on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.main import create_app
from app.settings import Settings

Operation = tuple[str, str, dict[str, Any]]


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    """The document as /openapi.json serves it (building it needs no lifespan)."""
    return create_app(Settings()).openapi()


def operations(openapi: dict[str, Any]) -> Iterator[Operation]:
    for path, item in openapi["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def test_every_operation_has_a_stable_camel_case_operation_id(openapi: dict[str, Any]) -> None:
    ids = {(method, path): op.get("operationId") for method, path, op in operations(openapi)}
    # Generated clients name their methods after these: renaming one breaks them.
    assert ids == {
        ("put", "/v1/streams/{stream_id}"): "putStream",
        ("get", "/v1/streams/{stream_id}"): "getStream",
        ("delete", "/v1/streams/{stream_id}"): "deleteStream",
        ("get", "/v1/streams"): "listStreams",
        ("post", "/v1/streams/{stream_id}/readings"): "postReadings",
        ("post", "/v1/readings"): "postManyReadings",
        ("get", "/v1/streams/{stream_id}/forecast"): "getForecast",
        ("get", "/v1/alarms"): "listAlarms",
        ("get", "/v1/alarms/{alarm_id}"): "getAlarm",
        ("post", "/v1/alarms/{alarm_id}/acknowledge"): "acknowledgeAlarm",
        ("get", "/v1/models"): "listModels",
        ("get", "/healthz"): "getHealth",
        ("get", "/readyz"): "getReadiness",
        ("get", "/metrics"): "getMetrics",
    }
    assert len(set(ids.values())) == len(ids)
