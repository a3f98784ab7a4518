"""What the API refuses rather than guesses at: thresholds no statistic can mean, sample periods
no sensor has, numbers in disguise and times in an ambiguous unit. Each answer is a 422 problem
that names the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

T0 = 1_767_225_600.0


def put_stream(client: TestClient, stream_id: str, **body: Any) -> Any:
    return client.put(f"/v1/streams/{stream_id}", json={"model": "auto", **body})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"detectors": {"point": {"threshold": -5}}}, "threshold"),
        ({"detectors": {"point": {"threshold": 0}}}, "threshold"),
        ({"detectors": {"missing": {"threshold": 1}}}, "missing"),
        ({"sample_period_s": 5e-324}, "sample_period_s"),
        ({"sample_period_s": 1e300}, "sample_period_s"),
        ({"detectors": {"point": {"policy": {"k": 1, "n": 1_000_000_000, "m": 1}}}}, "n"),
        ({"detectors": {"point": {"threshold": 1e308}}}, "threshold"),  # never reached
        # Numbers, counts and flags are JSON's own, never strings or booleans in disguise.
        ({"sample_period_s": "0.1"}, "sample_period_s"),
        ({"false_alarms_per_day": "2"}, "false_alarms_per_day"),
        ({"learning": {"readings": "500"}}, "readings"),
        ({"learning": {"readings": 500.0}}, "readings"),
        ({"detectors": {"point": {"threshold": "3"}}}, "threshold"),
        ({"detectors": {"point": {"policy": {"k": "1", "n": 2, "m": 3}}}}, "k"),
        ({"detectors": {"point": {"policy": {"k": 1, "n": 2, "m": 3, "clear": "0.5"}}}}, "clear"),
        ({"detectors": {"point": {"enabled": "no"}}}, "enabled"),
        ({"has_reference": 1}, "has_reference"),
    ],
)
def test_a_stream_configuration_out_of_bounds_is_refused(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    answer = put_stream(client, "bounded", **body)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert field in answer.text
    assert client.get("/v1/streams/bounded").status_code == 404


@pytest.mark.parametrize(
    ("reading", "message"),
    [
        ({"t": T0, "value": True}, "value"),
        ({"t": T0, "value": "1.5"}, "value"),
        ({"t": T0, "value": 1.0, "reference": "2"}, "reference"),
        ({"t": 1e12, "value": 1.0}, "milliseconds"),
        ({"t": -1, "value": 1.0}, "seconds since the Unix epoch"),
        ({"t": "1767225600", "value": 1.0}, "JSON number"),
        ({"t": True, "value": 1.0}, "RFC 3339"),
        ({"t": 0, "value": 1.0}, "1990 or later"),  # seconds since a recording began?
        ({"t": "1970-01-01T00:01:40Z", "value": 1.0}, "1990 or later"),
    ],
)
def test_a_reading_in_disguise_is_refused(
    client: TestClient, reading: dict[str, Any], message: str
) -> None:
    assert put_stream(client, "strict", sample_period_s=1.0).status_code in (200, 201)
    answer = client.post("/v1/streams/strict/readings", json={"readings": [reading]})
    assert answer.status_code == 422, answer.text
    assert message in answer.text
    assert client.get("/v1/streams/strict").json()["samples_seen"] == 0


def test_numbers_and_seconds_are_still_welcome(client: TestClient) -> None:
    assert put_stream(client, "fine", sample_period_s=0.001).status_code in (200, 201)
    readings = [{"t": T0, "value": 1}, {"t": T0 + 1, "value": -2.5e-9}]
    answer = client.post("/v1/streams/fine/readings", json={"readings": readings})
    assert answer.status_code == 200, answer.text
    assert client.get("/v1/streams/fine").json()["last_t"].startswith("2026-01-01T00:00:01")


def test_a_job_and_a_model_choice_take_numbers_not_strings(client: TestClient) -> None:
    assert put_stream(client, "jobs", sample_period_s=1.0).status_code in (200, 201)
    job = client.post("/v1/streams/jobs/jobs", json={"kind": "recalibrate", "epochs": "3"})
    assert job.status_code == 422 and "epochs" in job.text
    choice = client.post("/v1/streams/jobs/model", json={"name": "auto.jobs", "version": "1"})
    assert choice.status_code == 422 and "version" in choice.text
