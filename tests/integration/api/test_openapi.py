"""The OpenAPI document: what client generators and the /docs page rely on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from app import schemas
from app.main import create_app
from app.settings import Settings
from tests.integration.conftest import AppFactory

Operation = tuple[str, str, dict[str, Any]]
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    """The document as /openapi.json serves it (building it needs no lifespan), of a server
    with an API token: its writes declare the bearer scheme."""
    return create_app(Settings(api_token="a-token-of-enough-characters")).openapi()


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
        ("put", "/v1/streams"): "putStreams",
        ("post", "/v1/streams/{stream_id}/readings"): "postReadings",
        ("post", "/v1/readings"): "postManyReadings",
        ("get", "/v1/streams/{stream_id}/forecast"): "getForecast",
        ("get", "/v1/streams/{stream_id}/readings"): "getReadings",
        ("get", "/v1/alarms"): "listAlarms",
        ("get", "/v1/alarms/{alarm_id}"): "getAlarm",
        ("post", "/v1/alarms/{alarm_id}/acknowledge"): "acknowledgeAlarm",
        ("get", "/v1/incidents"): "listIncidents",
        ("get", "/v1/incidents/{incident_id}"): "getIncident",
        ("post", "/v1/incidents/{incident_id}/acknowledge"): "acknowledgeIncident",
        ("get", "/v1/models"): "listModels",
        ("get", "/v1/models/{name}"): "getModel",
        ("get", "/v1/models/{name}/versions/{version}"): "getModelVersion",
        ("post", "/v1/streams/{stream_id}/model"): "switchStreamModel",
        ("post", "/v1/streams/{stream_id}/jobs"): "createJob",
        ("put", "/v1/streams/{stream_id}/shadow"): "putShadow",
        ("get", "/v1/streams/{stream_id}/shadow"): "getShadow",
        ("delete", "/v1/streams/{stream_id}/shadow"): "deleteShadow",
        ("get", "/v1/jobs"): "listJobs",
        ("get", "/v1/jobs/{job_id}"): "getJob",
        ("delete", "/v1/jobs/{job_id}"): "cancelJob",
        ("get", "/healthz"): "getHealth",
        ("get", "/readyz"): "getReadiness",
        ("get", "/metrics"): "getMetrics",
    }
    assert len(set(ids.values())) == len(ids)


def test_every_error_is_documented_as_problem_json(openapi: dict[str, Any]) -> None:
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for method, path, operation in operations(openapi):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {PROBLEM: problem}, (method, path, status)
    schema = openapi["components"]["schemas"]["Problem"]
    assert set(schema["required"]) == {"type", "title", "status", "detail"}
    assert "HTTPValidationError" not in openapi["components"]["schemas"]  # FastAPI's own 422


def test_every_body_documents_the_400_of_malformed_json(openapi: dict[str, Any]) -> None:
    with_body = {
        operation["operationId"]: operation["responses"]
        for _, _, operation in operations(openapi)
        if "requestBody" in operation
    }
    assert set(with_body) == {
        "putStream",
        "putStreams",
        "postReadings",
        "postManyReadings",
        "acknowledgeAlarm",
        "acknowledgeIncident",
        "switchStreamModel",
        "createJob",
        "putShadow",
    }
    for operation_id, responses in with_body.items():
        assert {"400", "413", "422"} <= set(responses), operation_id
        assert responses["400"]["description"].startswith("Malformed JSON")


def test_writes_declare_the_bearer_scheme(openapi: dict[str, Any]) -> None:
    schemes = openapi["components"]["securitySchemes"]
    assert schemes["bearerAuth"]["type"] == "http"
    assert schemes["bearerAuth"]["scheme"] == "bearer"
    secured = {
        operation["operationId"]
        for _, _, operation in operations(openapi)
        if operation.get("security") == [{"bearerAuth": []}]
    }
    assert secured == {
        "putStream",
        "putStreams",
        "deleteStream",
        "postReadings",
        "postManyReadings",
        "acknowledgeAlarm",
        "acknowledgeIncident",
        "switchStreamModel",
        "createJob",
        "cancelJob",
        "putShadow",
        "deleteShadow",
    }
    for _, _, operation in operations(openapi):
        assert ("401" in operation["responses"]) == (operation["operationId"] in secured)


def test_every_request_body_has_examples_its_model_accepts(openapi: dict[str, Any]) -> None:
    bodies = [op["requestBody"] for _, _, op in operations(openapi) if "requestBody" in op]
    assert len(bodies) == 9
    for body in bodies:
        ref = body["content"]["application/json"]["schema"]["$ref"]
        name = ref.removeprefix("#/components/schemas/")
        examples = openapi["components"]["schemas"][name]["examples"]
        assert examples, name
        model: type[BaseModel] = getattr(schemas, name)
        for example in examples:
            model.model_validate_json(json.dumps(example))  # as a client would send it


def test_a_reading_time_is_documented_as_rfc_3339_or_epoch_seconds(
    openapi: dict[str, Any],
) -> None:
    t = openapi["components"]["schemas"]["ReadingIn"]["properties"]["t"]
    assert {"type": "string", "format": "date-time"} in t["anyOf"]
    assert {"type": "number"} in t["anyOf"]
    assert "RFC 3339" in t["description"] and "epoch" in t["description"]
    assert {type(example) for example in t["examples"]} == {str, float}


def test_protected_reads_declare_the_bearer_scheme(make_client: AppFactory) -> None:
    token = "a-read-only-token-for-dashboards"
    client = make_client(read_token=token)
    document = client.get("/openapi.json", headers={"Authorization": f"Bearer {token}"}).json()
    for method, path, operation in operations(document):
        # Reads need the read token; writes need nothing on a server without an API token.
        if operation["operationId"] in ("getHealth", "getReadiness") or method != "get":
            assert "security" not in operation and "401" not in operation["responses"]
        else:
            assert operation.get("security") == [{"bearerAuth": []}], (path, method)
            assert "401" in operation["responses"], (path, method)


def test_an_open_server_declares_no_token() -> None:
    document = create_app(Settings()).openapi()
    for _, _, operation in operations(document):
        assert "security" not in operation and "401" not in operation["responses"]


def test_the_model_lifecycle_answers_have_examples_their_models_accept(
    openapi: dict[str, Any],
) -> None:
    for name in ("ModelVersionOut", "ReadingsHistory", "JobOut", "ShadowOut"):
        examples = openapi["components"]["schemas"][name]["examples"]
        assert examples, name
        model: type[BaseModel] = getattr(schemas, name)
        for example in examples:
            model.model_validate_json(json.dumps(example))
