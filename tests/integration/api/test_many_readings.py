"""`POST /v1/readings`: many streams in one request, one transaction, stepped together.

Streams of the stateful LSTM with one reading each share one batched LSTM step; every stream's
results must still be those of the offline evaluation, alarms included. Runs against SQLite
and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.forecasting.artifacts import load_model
from app.main import create_app
from app.monitoring.config import MonitorConfig
from app.monitoring.evaluation import stream_record
from app.monitoring.incidents import alarm_spans
from app.schemas import ManyReadingsOut
from app.series import Series
from app.settings import Settings
from app.storage.db import Database
from tests.support.models import epoch_times, lab_series, stateful_lab_model

MODEL = "lstm-stateful-lab"
START, STOP = 6000, 8000  # warm-up (256 readings) on normal data, then the lab's faults
STREAMS = ["pump-a", "pump-b", "pump-c"]
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    stateful_lab_model(directory, MODEL)
    return directory


@pytest.fixture(scope="module")
def series() -> Series:
    return lab_series()


@pytest.fixture
def client(database: Database, models: Path, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=database.url,
        models_dir=models,
        default_model=MODEL,
        data_dir=tmp_path / "data",
        migrate_on_start=False,
        max_batch=1000,
        checkpoint_every=250,
        stale_periods=0,  # no stale timer: a stream posted after the others is not silent
    )
    with TestClient(create_app(settings)) as test_client:
        for stream in STREAMS:
            created = test_client.put(f"/v1/streams/{stream}", json={"has_reference": True})
            assert created.status_code == 201, created.text
        yield test_client


def reading(series: Series, sample: int) -> dict[str, Any]:
    assert series.reference is not None
    return {
        "t": float(epoch_times(sample, sample + 1)[0]),
        "value": float(series.value[sample]),
        "reference": float(series.reference[sample]),
    }


def tick(client: TestClient, items: list[tuple[str, list[dict[str, Any]]]]) -> Any:
    body = {"streams": [{"stream": s, "readings": r} for s, r in items]}
    return client.post("/v1/readings", json=body)


def samples_seen(client: TestClient, stream: str) -> int:
    return int(client.get(f"/v1/streams/{stream}").json()["samples_seen"])


def offline(series: Series, model_dir: Path) -> tuple[np.ndarray, list[tuple[str, int, Any]]]:
    loaded = load_model(model_dir)
    piece = Series(
        t=series.t[START:STOP], columns={k: v[START:STOP] for k, v in series.columns.items()}
    )
    config = MonitorConfig.from_manifest(loaded.manifest)
    record = stream_record(loaded.forecaster, config, piece, ["value"], sample_period_s=0.1)
    # The service's rows join a detector's re-openings within the quiet window: the same rule.
    return record.residuals, sorted(alarm_spans(record.events))


def test_streams_stepped_together_equal_the_offline_evaluation(
    client: TestClient, series: Series, models: Path
) -> None:
    """Three streams, one reading each per request (a gateway's ticks), and one stream's
    batches of 50 in between: each equals `twinwatch evaluate monitor` on the record."""
    residuals: dict[str, list[float]] = {stream: [] for stream in STREAMS}
    for sample in range(START, STOP):
        response = tick(client, [(s, [reading(series, sample)]) for s in STREAMS[:2]])
        assert response.status_code == 200, response.text
        modelled = ManyReadingsOut.model_validate_json(response.content).model_dump_json()
        assert response.content == modelled.encode()  # plain data, as the model serialises
        for answer in response.json()["streams"]:
            assert answer["accepted"] == 1
            residuals[answer["stream"]].extend(
                np.nan if r["residual"] is None else r["residual"] for r in answer["results"]
            )
        if (sample - START) % 50 == 49:
            batch = [reading(series, i) for i in range(sample - 49, sample + 1)]
            answer = tick(client, [(STREAMS[2], batch)]).json()["streams"][0]
            residuals[STREAMS[2]].extend(
                np.nan if r["residual"] is None else r["residual"] for r in answer["results"]
            )
    expected_residuals, expected_events = offline(series, models / MODEL)
    assert np.isnan(expected_residuals[:256]).all()
    for stream in STREAMS:
        np.testing.assert_allclose(residuals[stream], expected_residuals, rtol=0, atol=1e-5)
        rows = client.get("/v1/alarms", params={"stream": stream, "limit": 1000}).json()["items"]
        events = sorted((a["detector"], a["opened_sample"], a["closed_sample"]) for a in rows)
        assert events == expected_events, stream
    opened = {(d, s + START) for d, s, _ in expected_events}
    assert ("point", 7100) in opened or ("level", 7100) in opened  # the spike, at once


def test_one_bad_stream_refuses_the_whole_request(client: TestClient, series: Series) -> None:
    first = tick(client, [(s, [reading(series, START)]) for s in STREAMS])
    assert first.status_code == 200
    bad = [reading(series, START + 2), reading(series, START + 1)]  # out of order
    response = tick(client, [("pump-a", [reading(series, START + 1)]), ("pump-b", bad)])
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["stream"] == "pump-b" and "'pump-b'" in problem["detail"]
    assert samples_seen(client, "pump-a") == samples_seen(client, "pump-b") == 1

    unknown = tick(client, [("pump-a", [reading(series, START + 1)]), ("nope", [])])
    assert unknown.status_code == 404 and unknown.json()["stream"] == "nope"
    twice = tick(client, [("pump-a", [reading(series, START + 1)])] * 2)
    assert twice.status_code == 422 and "more than once" in twice.json()["detail"]
    older = tick(client, [("pump-a", [reading(series, START + 1)]), ("pump-c", [])])
    assert older.status_code == 200  # pump-c sends nothing: fine
    assert samples_seen(client, "pump-a") == 2 and samples_seen(client, "pump-b") == 1


def test_a_resent_tick_is_counted_as_duplicates(client: TestClient, series: Series) -> None:
    items = [(s, [reading(series, START), reading(series, START + 1)]) for s in STREAMS]
    assert tick(client, items).status_code == 200
    again = tick(client, items).json()["streams"]
    assert [(a["accepted"], a["duplicates"]) for a in again] == [(0, 2)] * 3


def test_too_many_readings_in_one_request_is_413(client: TestClient, series: Series) -> None:
    many = [reading(series, START + i) for i in range(400)]
    response = tick(client, [(s, many) for s in STREAMS])  # 1,200 > 1,000
    assert response.status_code == 413
    assert all(samples_seen(client, s) == 0 for s in STREAMS)


def test_malformed_bodies_are_422_problems(client: TestClient) -> None:
    for body in ({}, {"streams": [{"stream": "bad id!", "readings": []}]}, {"streams": "x"}):
        response = client.post("/v1/readings", json=body)
        assert response.status_code == 422, body
        assert response.headers["content-type"] == PROBLEM


def test_results_false_answers_with_the_acknowledgement_only(
    client: TestClient, series: Series
) -> None:
    items = [(s, [reading(series, START + i) for i in range(3)]) for s in STREAMS]
    body = {"streams": [{"stream": s, "readings": r} for s, r in items]}
    answer = client.post("/v1/readings?results=false", json=body).json()["streams"]
    assert [(a["stream"], a["accepted"], a["results"]) for a in answer] == [
        (s, 3, []) for s in STREAMS
    ]
    single = client.post(
        "/v1/streams/pump-a/readings?results=false",
        json={"readings": [reading(series, START + 3)]},
    ).json()
    assert (single["accepted"], single["results"]) == (1, [])
    assert samples_seen(client, "pump-a") == 4
