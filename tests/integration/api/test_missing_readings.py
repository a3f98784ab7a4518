"""Readings that come without a number are watched on every stream, whatever its model: the
twin's missing-data faults, sent to a stream of the shipped model, each raise a `missing` alarm
while they last, and a detector override the model does not have is refused rather than
accepted and ignored."""

from __future__ import annotations

from typing import Any

from app.forecasting.artifacts import load_model
from app.simulation.faults import Fault, FaultType
from app.storage.repositories import streams as stream_repo
from app.twin.schedule import build_scenario
from tests.integration.conftest import AppFactory
from tests.support.models import epoch_times

SHIPPED = "lstm-stateful-day-seed3"
START, STOP = 6000, 8000
FAULTS = (
    Fault(type=FaultType.MISSING, start=7100, end=7106),  # a short gap: imputed
    Fault(type=FaultType.MISSING, start=7500, end=7540),  # longer than the gap limit
)


def readings() -> list[dict[str, Any]]:
    scenario = build_scenario(0, START, STOP - START, FAULTS, run_length=STOP)
    times = epoch_times(START, STOP)
    return [
        {
            "t": float(t),
            "value": None if value != value else float(value),  # NaN: missing
            "reference": float(reference),
        }
        for t, value, reference in zip(times, scenario.values, scenario.references, strict=True)
    ]


def test_the_twins_missing_data_faults_are_caught_on_a_shipped_model(
    make_client: AppFactory,
) -> None:
    client = make_client(shipped_models=True, artifact_loader=load_model)
    made = client.put("/v1/streams/pump", json={"model": SHIPPED, "has_reference": True})
    assert made.status_code == 201, made.text
    assert "missing" in made.json()["live"]["detectors"]
    rows = readings()
    for first in range(0, len(rows), 500):
        body = {"readings": rows[first : first + 500]}
        answer = client.post("/v1/streams/pump/readings?results=false", json=body)
        assert answer.status_code == 200, answer.text
    alarms = client.get("/v1/alarms", params={"stream": "pump", "limit": 500}).json()["items"]
    missing = sorted(
        (a["opened_sample"] + START, a["closed_sample"] + START)
        for a in alarms
        if a["detector"] == "missing"
    )
    assert len(missing) == len(FAULTS), missing
    for (opened, closed), fault in zip(missing, FAULTS, strict=True):
        assert fault.start <= opened < fault.start + 3  # the third null of the last ten
        assert fault.end <= closed <= fault.end + 10  # ten complete readings after it


def test_an_override_of_a_detector_the_model_lacks_is_refused(make_client: AppFactory) -> None:
    client = make_client()
    refused = client.put("/v1/streams/p", json={"detectors": {"cusum": {"threshold": 3.0}}})
    assert refused.status_code == 422
    assert "no detector cusum" in refused.json()["detail"]
    assert client.get("/v1/streams/p").status_code == 404
    off = client.put("/v1/streams/p", json={"detectors": {"missing": {"enabled": False}}})
    assert off.status_code == 201
    assert "missing" not in off.json()["live"]["detectors"]


def test_a_stream_stored_with_such_an_override_still_resumes(make_client: AppFactory) -> None:
    """An earlier release accepted (and ignored) an override of a detector the model lacks: a
    stream stored with one keeps running after an upgrade, the override still ignored."""
    client = make_client()
    assert client.put("/v1/streams/old", json={}).status_code == 201
    database = client.app_state["twinwatch"].database
    client.__exit__(None, None, None)
    with database.session() as session:
        stream = stream_repo.require(session, "old")
        stream.detector_overrides = {"cusum": {"enabled": True, "threshold": 2.0}}
    again = make_client()
    reading = {"readings": [{"t": 1_767_225_600.0, "value": 1.0}]}
    assert again.post("/v1/streams/old/readings", json=reading).status_code == 200
    assert "cusum" not in again.get("/v1/streams/old").json()["live"]["detectors"]
