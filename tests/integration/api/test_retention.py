"""A retention period removes old readings at a stream's checkpoints, never one a restart
replays: the stream resumes exactly as one that kept everything."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from app.storage.db import Database
from app.storage.repositories import readings as reading_repo
from tests.integration.conftest import AppFactory

START = 1_767_225_600.0
DAY = 86_400.0


def rows(first: int, count: int, step: float) -> list[dict[str, Any]]:
    return [
        {"t": START + (first + i) * step, "value": 1.0 + 0.1 * ((first + i) % 7)}
        for i in range(count)
    ]


def post(client: TestClient, stream: str, readings: list[dict[str, Any]]) -> Any:
    answer = client.post(f"/v1/streams/{stream}/readings", json={"readings": readings})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_old_readings_go_and_the_stream_resumes_as_if_they_had_not(
    make_client: AppFactory, database: Database
) -> None:
    step = DAY / 40  # 3 days in 120 readings
    results = {}
    for stream, retention in (("pruned", 1.0), ("kept", None)):
        settings = {"checkpoint_every": 10, "readings_retention_days": retention}
        first = make_client(**settings)
        assert first.put(f"/v1/streams/{stream}", json={"sample_period_s": step}).status_code == 201
        for start in range(0, 120, 15):
            post(first, stream, rows(start, 15, step))
        first.__exit__(None, None, None)  # a clean stop: checkpointed
        again = make_client(**settings)
        results[stream] = post(again, stream, rows(120, 15, step))["results"]
        with database.session() as session:
            batches = reading_repo.batches_from(session, stream_id=stream)
            assert reading_repo.count(session, stream_id=stream) == 135
        if retention is None:
            assert batches[0].first_sample == 0
        else:
            # Nothing older than a day before the stream's last checkpointed reading, but every
            # reading after its checkpoint.
            assert batches[0].first_sample > 0
            oldest_kept = reading_repo.datetime_at(int(batches[0].micros[-1])).timestamp()
            assert oldest_kept >= START + 119 * step - DAY - 15 * step
            assert batches[-1].stop == 135
    assert results["pruned"] == results["kept"]
