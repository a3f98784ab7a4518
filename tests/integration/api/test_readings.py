"""Readings through the HTTP API: equivalence with the offline evaluation, idempotency, bad input.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.forecasting.artifacts import load_model
from app.main import create_app
from app.monitoring.config import MonitorConfig
from app.monitoring.evaluation import stream_record
from app.monitoring.incidents import alarm_spans
from app.schemas import ReadingsOut
from app.series import Series
from app.settings import Settings
from app.simulation.faults import LAB_FAULTS
from app.storage.db import Database
from tests.support.models import calibrated_lab_model, epoch_times, lab_series

STREAM = "pump-1"
START, SPLIT, STOP = 6000, 7000, 8000  # warm-up on normal data, then the lab's faults


@pytest.fixture(scope="module")
def lab_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    calibrated_lab_model(directory)
    return directory


@pytest.fixture(scope="module")
def series() -> Series:
    return lab_series()


@pytest.fixture
def client(
    database: Database, lab_models: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[TestClient]:
    """The lab's model; a test marked `every_series` gets every per-stream metric."""
    settings = Settings(
        database_url=database.url,
        models_dir=lab_models,
        default_model="lstm-seed0",
        data_dir=tmp_path / "data",
        migrate_on_start=False,
        max_batch=1000,
        max_body_bytes=1_000_000,
        metrics_per_stream="all" if request.node.get_closest_marker("every_series") else "alarms",
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def readings(series: Series, start: int, stop: int) -> list[dict[str, Any]]:
    assert series.reference is not None
    times = epoch_times(start, stop)
    return [
        {"t": float(t), "value": float(series.value[i]), "reference": float(series.reference[i])}
        for t, i in zip(times, range(start, stop), strict=True)
    ]


def post(client: TestClient, body: Any, stream: str = STREAM) -> Any:
    return client.post(f"/v1/streams/{stream}/readings", json=body)


def create_stream(client: TestClient, **config: Any) -> None:
    response = client.put(f"/v1/streams/{STREAM}", json={"has_reference": True, **config})
    assert response.status_code == 201, response.text


def stream_in_batches(client: TestClient, series: Series, size: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for start in range(START, STOP, size):
        response = post(client, {"readings": readings(series, start, min(start + size, STOP))})
        assert response.status_code == 200, response.text
        # Built as plain data: byte for byte what the response model serialises.
        modelled = ReadingsOut.model_validate_json(response.content).model_dump_json()
        assert response.content == modelled.encode()
        results.extend(response.json()["results"])
    return results


def offline(
    series: Series, model_dir: Path
) -> tuple[np.ndarray, list[tuple[str, int, int | None]]]:
    """What `twinwatch evaluate monitor` computes on the same slice of the record."""
    loaded = load_model(model_dir)
    piece = Series(
        t=series.t[START:STOP], columns={k: v[START:STOP] for k, v in series.columns.items()}
    )
    config = MonitorConfig.from_manifest(loaded.manifest)
    record = stream_record(loaded.forecaster, config, piece, ["value"], sample_period_s=0.1)
    # The service's rows join a detector's re-openings within the quiet window: the same rule.
    return record.residuals, sorted(alarm_spans(record.events))


def alarm_rows(client: TestClient) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"stream": STREAM, "limit": 100}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/alarms", params=params).json()
        rows.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return rows


@pytest.mark.parametrize("size", [1, 7, 100])
def test_streaming_equals_the_offline_evaluation(
    client: TestClient, series: Series, lab_models: Path, size: int
) -> None:
    create_stream(client)
    results = stream_in_batches(client, series, size)
    expected_residuals, expected_events = offline(series, lab_models / "lstm-seed0")
    residuals = np.array([np.nan if r["residual"] is None else r["residual"] for r in results])
    np.testing.assert_array_equal(residuals, expected_residuals)
    rows = alarm_rows(client)
    assert sorted((a["detector"], a["opened_sample"], a["closed_sample"]) for a in rows) == (
        expected_events
    )
    # The lab's faults all raise alarms (samples are counted from the stream's first reading).
    opened = {(a["detector"], a["opened_sample"] + START) for a in rows}
    assert ("point", 7100) in opened  # the spike, at once
    assert any(d == "level" and 7250 <= s < 7260 for d, s in opened)  # the offset
    assert any(d == "rolling_rms" and 7450 <= s < 7750 for d, s in opened)  # the excitation
    assert any(d == "variance_floor" and 7850 <= s < 7900 for d, s in opened)  # stuck sensor


def test_no_alarm_and_no_forecast_while_warming_up(client: TestClient, series: Series) -> None:
    create_stream(client)
    body = {"readings": readings(series, START, START + 64)}
    for reading in body["readings"][::3]:
        reading["value"] += 10.0  # wild readings cannot alarm before the window is warm
    answer = post(client, body).json()
    assert answer["accepted"] == 64 and answer["opened"] == []
    assert all(r["forecast"] is None for r in answer["results"])
    live = client.get(f"/v1/streams/{STREAM}").json()["live"]
    assert live["warmup_remaining"] == 0


def test_resending_a_batch_is_idempotent(client: TestClient, series: Series) -> None:
    create_stream(client)
    first = readings(series, START, START + 300)
    assert post(client, {"readings": first}).json()["accepted"] == 300
    again = post(client, {"readings": first[200:] + readings(series, START + 300, START + 310)})
    assert again.status_code == 200
    body = again.json()
    assert (body["accepted"], body["duplicates"]) == (10, 100)
    assert body["results"][0]["t"].startswith("2023-11-14T22:")
    stream = client.get(f"/v1/streams/{STREAM}").json()
    assert stream["samples_seen"] == 310


def test_retried_stream_equals_a_clean_one(
    client: TestClient, series: Series, lab_models: Path
) -> None:
    """Every batch sent twice (a client retrying after a lost answer) changes nothing."""
    create_stream(client)
    results: list[dict[str, Any]] = []
    for start in range(START, STOP, 250):
        body = {"readings": readings(series, start, start + 250)}
        results.extend(post(client, body).json()["results"])
        assert post(client, body).json()["accepted"] == 0
    expected, events = offline(series, lab_models / "lstm-seed0")
    residuals = np.array([np.nan if r["residual"] is None else r["residual"] for r in results])
    np.testing.assert_allclose(residuals, expected, rtol=0, atol=1e-5)
    rows = alarm_rows(client)
    assert sorted((a["detector"], a["opened_sample"], a["closed_sample"]) for a in rows) == events


@pytest.mark.parametrize(
    ("mutate", "status", "fragment"),
    [
        (lambda b: b["readings"][0].update(t=b["readings"][0]["t"] - 1000), 409, "older than"),
        (lambda b: b["readings"][0].update(value=b["readings"][0]["value"] + 1), 409, "another"),
        (lambda b: b["readings"][0].update(reference=0.0), 409, "another value"),
    ],
)
def test_conflicting_resends_are_refused_and_change_nothing(
    client: TestClient, series: Series, mutate: Any, status: int, fragment: str
) -> None:
    create_stream(client)
    assert post(client, {"readings": readings(series, START, START + 100)}).status_code == 200
    before = client.get(f"/v1/streams/{STREAM}").json()
    body = {"readings": readings(series, START + 99, START + 120)}
    mutate(body)
    answer = post(client, body)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/problem+json"
    assert fragment in answer.json()["detail"]
    assert client.get(f"/v1/streams/{STREAM}").json() == before
    # The stream goes on as if the bad request never came.
    good = post(client, {"readings": readings(series, START + 100, START + 120)})
    assert good.json()["accepted"] == 20


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("malformed JSON", b'{"readings": [', 400, "not valid JSON"),
    ("no body", b"", 422, "body: Field required"),
    ("not an object", b"[1, 2]", 422, "readings"),
    ("NaN value", b'{"readings": [{"t": 1.7e9, "value": NaN}]}', 422, "value"),
    ("infinite value", b'{"readings": [{"t": 1.7e9, "value": 1e999}]}', 422, "value"),
    ("string value", {"readings": [{"t": 1.7e9, "value": "high"}]}, 422, "value"),
    ("missing time", {"readings": [{"value": 1.0}]}, 422, "t"),
    ("naive time", {"readings": [{"t": "2025-01-01T00:00:00", "value": 1.0}]}, 422, "t"),
    ("unknown field", {"readings": [{"t": 1.7e9, "valeu": 1.0}]}, 422, "valeu"),
    (
        "out of order",
        {"readings": [{"t": 1.7e9 + 1, "value": 1.0}, {"t": 1.7e9, "value": 1.0}]},
        422,
        "increasing time order",
    ),
    (
        "repeated time",
        {"readings": [{"t": 1.7e9, "value": 1.0}, {"t": 1.7e9, "value": 1.0}]},
        422,
        "increasing time order",
    ),
    (
        "far future",
        {"readings": [{"t": "9999-12-31T23:59:59Z", "value": 1.0}]},
        422,
        "ahead of the server clock",
    ),
    ("unknown channel", {"readings": [{"t": 1.7e9, "values": {"load": 1.0}}]}, 422, "load"),
    ("value and values", {"readings": [{"t": 1.7e9, "value": 1.0, "values": {}}]}, 422, "both"),
    (
        "too many readings",
        {"readings": [{"t": 1.7e9 + i, "value": 1.0} for i in range(1001)]},
        413,
        "at most 1000",
    ),
    ("oversize body", b'{"readings": [' + b" " * 1_100_000 + b"]}", 413, "exceeds"),
]


def test_a_body_that_says_it_is_not_json_is_refused(client: TestClient) -> None:
    create_stream(client, has_reference=False)
    response = client.post(
        f"/v1/streams/{STREAM}/readings",
        content=b'{"readings": []}',
        headers={"content-type": "text/plain"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "body"


@pytest.mark.parametrize(
    ("name", "body", "status", "fragment"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
def test_bad_input_gets_a_problem_and_changes_nothing(
    client: TestClient, series: Series, name: str, body: Any, status: int, fragment: str
) -> None:
    create_stream(client, has_reference=False)
    response = (
        client.post(
            f"/v1/streams/{STREAM}/readings",
            content=body,
            headers={"content-type": "application/json"},
        )
        if isinstance(body, bytes)
        else post(client, body)
    )
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status and fragment in json.dumps(problem)
    stream = client.get(f"/v1/streams/{STREAM}").json()
    assert stream["samples_seen"] == 0 and stream["last_t"] is None


def test_reference_on_a_stream_without_one_is_refused(client: TestClient) -> None:
    create_stream(client, has_reference=False)
    answer = post(client, {"readings": [{"t": 1.7e9, "value": 1.0, "reference": 1.0}]})
    assert answer.status_code == 422 and "has_reference" in answer.json()["detail"]


def test_unknown_stream_is_404(client: TestClient) -> None:
    answer = post(client, {"readings": [{"t": 1.7e9, "value": 1.0}]}, stream="nope")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"


QUALITY = ("level", "missing")  # (detectors that need no window of residuals)


def test_a_gap_of_nulls_never_causes_an_alarm_storm(client: TestClient, series: Series) -> None:
    create_stream(client)
    body = readings(series, START, START + 1000)
    for reading in body[400:405]:  # a short gap: imputed, monitoring pauses for one window
        reading["value"] = None
    for reading in body[600:640]:  # a long gap: the stream warms up again
        reading["value"] = None
    answer = post(client, {"readings": body}).json()
    # Each gap is one `missing` alarm (data quality), closed once readings come again; the
    # residual detectors raise nothing.
    gaps = [(a["detector"], a["opened_sample"], a["closed_sample"]) for a in answer["opened"]]
    assert gaps == [("missing", 402, 414), ("missing", 602, 649)]
    results = answer["results"]
    assert all(r["imputed"] for r in results[400:405])
    assert all(r["residual"] is None for r in results[400:405])
    assert all(r["forecast"] is None for r in results[610 : 640 + 64])
    assert results[640 + 64]["forecast"] is not None
    # Residual detectors pause while the window holds an imputed value; the level detector
    # (reading against reference) needs no window and pauses only for the nulls themselves.
    paused = results[400 : 405 + 64]
    assert all(v is None for r in paused for k, v in r["statistics"].items() if k not in QUALITY)
    assert all(r["statistics"]["missing"] == 1 for r in results[400:405])
    assert all(r["statistics"]["level"] is None for r in results[400:405])
    assert all(r["statistics"]["point"] is not None for r in results[405 + 64 : 600])


def test_forecast_endpoint(client: TestClient, series: Series) -> None:
    create_stream(client)
    warming = client.get(f"/v1/streams/{STREAM}/forecast")
    assert warming.status_code == 422 and "warming up" in warming.json()["detail"]
    post(client, {"readings": readings(series, START, START + 100)})
    answer = client.get(f"/v1/streams/{STREAM}/forecast", params={"horizon": 1}).json()
    assert len(answer["forecast"]) == 1
    assert abs(answer["forecast"][0] - series.value[START + 100]) < 1.0
    too_far = client.get(f"/v1/streams/{STREAM}/forecast", params={"horizon": 5})
    assert too_far.status_code == 422 and "horizon" in too_far.json()["detail"]
    assert client.get(f"/v1/streams/{STREAM}/forecast", params={"horizon": 0}).status_code == 422


def metric_samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.mark.every_series
def test_metrics_after_the_lab_scenario(client: TestClient, series: Series) -> None:
    create_stream(client)
    stream_in_batches(client, series, 100)
    rows = alarm_rows(client)
    samples = metric_samples(client)
    label = (("stream", STREAM),)
    assert samples[("twinwatch_readings_total", label)] == STOP - START
    for detector in ("point", "rolling_rms", "variance_floor", "cusum", "level"):
        key = (("detector", detector), ("stream", STREAM))
        opened = sum(1 for a in rows if a["detector"] == detector)
        assert samples[("twinwatch_alarms_total", key)] == opened
        still_open = sum(1 for a in rows if a["detector"] == detector and a["state"] == "open")
        assert samples[("twinwatch_alarm_active", key)] == still_open
        assert samples[("twinwatch_detector_threshold", key)] > 0
        assert ("twinwatch_detector_statistic", key) in samples
    live = client.get(f"/v1/streams/{STREAM}").json()["live"]
    assert samples[("twinwatch_residual", label)] == pytest.approx(live["last_residual"])
    assert samples[("twinwatch_ingest_duration_seconds_count", ())] == (STOP - START) / 100
    # The aggregates agree with the streams' series.
    assert samples[("twinwatch_readings_accepted_total", ())] == STOP - START
    for detector in {a["detector"] for a in rows}:
        opened = sum(1 for a in rows if a["detector"] == detector)
        assert samples[("twinwatch_alarms_opened_total", (("detector", detector),))] == opened
    # Rejections are counted by reason: one reading older than the stream's last.
    post(client, {"readings": [{"t": 1e9, "value": 1.0, "reference": 1.0}]})  # (2001)
    conflict = (("reason", "conflict"), ("stream", STREAM))
    assert metric_samples(client)[("twinwatch_readings_rejected_total", conflict)] == 1


def test_each_lab_fault_is_one_incident(client: TestClient, series: Series) -> None:
    create_stream(client)
    stream_in_batches(client, series, 100)
    incidents = client.get("/v1/incidents", params={"stream": STREAM}).json()["items"]
    spans = sorted((i["opened_sample"], i["closed_sample"]) for i in incidents)
    assert len(spans) == len(LAB_FAULTS), spans
    for fault in LAB_FAULTS:  # (the stream's sample 0 is the record's START)
        start, end = fault.start - START, fault.end - START
        touching = [(a, b) for a, b in spans if a < end + 20 and (b is None or b > start)]
        assert len(touching) == 1, (fault, spans)
    # An incident lists every detector that alarmed with its first alarm and peak.
    detail = client.get(f"/v1/incidents/{incidents[-1]['id']}").json()
    assert detail["detectors"] and detail["alarms"]
    for detector in detail["detectors"].values():
        assert detector["peak_over_threshold"] is not None
    samples = metric_samples(client)
    label = (("stream", STREAM),)
    assert samples[("twinwatch_incidents_total", label)] >= len(incidents)
    open_now = sum(1 for i in incidents if i["state"] == "open")
    assert samples.get(("twinwatch_incidents_open", label), 0) == open_now  # none: not shown
