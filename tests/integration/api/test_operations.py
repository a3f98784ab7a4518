"""Start-up, models, health, readiness and the Prometheus endpoint."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, inspect

from app.main import create_app
from app.settings import Settings
from app.storage import migrations
from app.storage.db import Database
from app.storage.repositories import model_entries
from tests.integration.conftest import (
    LAB_LIKE_THRESHOLDS,
    AppFactory,
    FakeArtifact,
    fake_loader,
    write_fake_model,
)


def samples_of(client: TestClient) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def test_models_lists_what_loaded(client: TestClient) -> None:
    items = client.get("/v1/models").json()["items"]
    assert [item["name"] for item in items] == ["lstm-seed0", "naive-2ch"]  # not "broken"
    default = items[0]
    assert default["kind"] == "naive"
    assert (default["window"], default["horizon"], default["n_channels"]) == (8, 1, 1)
    assert default["thresholds"] == LAB_LIKE_THRESHOLDS
    assert default["metrics"] == {"rmse": 0.133}
    assert len(default["manifest_sha256"]) == 64
    # Versions are numbered per name (the first artifact a name had is 1), whatever the
    # manifest calls its own.
    assert default["version"] == "1"
    assert items[1]["version"] == "1"


def test_loaded_models_are_recorded_in_the_database(client: TestClient, database: Database) -> None:
    with database.session() as session:
        entries = {entry.name: entry for entry in model_entries.list_all(session)}
    assert set(entries) == {"auto", "lstm-seed0", "naive-2ch"}  # auto: streams that learn
    assert entries["auto"].kind == "learned"
    assert entries["lstm-seed0"].thresholds == LAB_LIKE_THRESHOLDS
    assert entries["naive-2ch"].config["n_channels"] == 2
    assert entries["naive-2ch"].version == "1"
    assert entries["naive-2ch"].active_version == 1


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200  # (ready while the streams are restored: none here)
    deadline = time.monotonic() + 10
    while ready.json()["checks"]["streams"] != "0 restored":
        assert time.monotonic() < deadline, ready.json()
        ready = client.get("/readyz")
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": "ok", "streams": "0 restored", "models": "2 loaded"},
    }


def test_not_ready_without_the_default_model(make_client: AppFactory) -> None:
    client = make_client(default_model="broken")
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert "default model 'broken' not loaded" in problem["detail"]
    assert "weights truncated" in problem["detail"]
    assert problem["checks"]["database"] == "ok"
    assert client.get("/healthz").status_code == 200  # alive, just not ready


def test_not_ready_when_the_database_is_gone(client: TestClient) -> None:
    assert client.get("/readyz").status_code == 200
    # An outage: the running app's engine now points at a port nobody listens on.
    state = client.app_state["twinwatch"]
    assert isinstance(state.database, Database)
    state.database.engine.dispose()
    state.database.engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["checks"]["database"] == "database unreachable: OperationalError"
    assert client.get("/healthz").status_code == 200


def test_an_outage_answers_retry_after_and_is_logged_once(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Every 503 says when to come back; the outage is logged when it starts and when it ends
    (with a count), not once per failed request and never with a traceback."""
    assert client.put("/v1/streams/pump-1", json={}).status_code == 201
    state = client.app_state["twinwatch"]
    working = state.database.engine
    gone = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    state.database.engine = gone
    state.database.sessions.configure(bind=gone)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        for second in range(5):
            answer = client.post(
                "/v1/streams/pump-1/readings",
                json={"readings": [{"t": 1_767_225_600 + second, "value": 1.0}]},
            )
            assert answer.status_code == 503
            assert int(answer.headers["Retry-After"]) > 0
            assert "safe to re-send" in answer.json()["detail"]
        assert int(client.get("/readyz").headers["Retry-After"]) > 0
        state.database.engine = working
        state.database.sessions.configure(bind=working)
        assert client.get("/v1/streams/pump-1").status_code == 200
    messages = [r.getMessage() for r in caplog.records if "database" in r.getMessage()]
    assert len(messages) == 2, messages
    assert "unavailable" in messages[0] and "available again" in messages[1]
    assert "6 failed request(s)" in messages[1]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_the_job_runner_tells_an_outage_once(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The job runner polls the database: through an outage it says so once, as requests do,
    not with a traceback every few seconds, and says when the database is back."""
    state = client.app_state["twinwatch"]
    working = state.database.engine
    gone = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")

    def said(text: str) -> int:
        return sum(text in record.getMessage() for record in caplog.records)

    def wait_until(condition: Any) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            state.jobs.wake()
            time.sleep(0.05)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        state.database.engine = gone
        state.database.sessions.configure(bind=gone)
        wait_until(lambda: said("first on the job runner"))
        for _ in range(3):  # more tries meet the same outage: nothing more is said
            state.jobs.wake()
            time.sleep(0.2)
        state.database.engine = working
        state.database.sessions.configure(bind=working)
        wait_until(lambda: said("available again"))
    assert said("database unavailable") == 1
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_metrics_expose_model_info_and_stream_series(make_client: AppFactory) -> None:
    client = make_client(metrics_per_stream="all")
    client.put("/v1/streams/pump-1", json={})
    samples = samples_of(client)
    info = {labels["model"]: (labels, value) for labels, value in samples["twinwatch_model_info"]}
    assert set(info) == {"lstm-seed0", "naive-2ch"}
    assert info["naive-2ch"] == ({"model": "naive-2ch", "version": "1", "kind": "naive"}, 1.0)
    assert samples["twinwatch_readings_total"] == [({"stream": "pump-1"}, 0.0)]
    reasons = {labels["reason"] for labels, _ in samples["twinwatch_readings_rejected_total"]}
    assert reasons == {"invalid", "conflict", "too_large"}
    assert "twinwatch_ingest_duration_seconds_count" in samples

    client.delete("/v1/streams/pump-1")
    after = samples_of(client)
    assert "twinwatch_readings_total" not in after
    assert "twinwatch_readings_rejected_total" not in after


def test_by_default_a_healthy_stream_adds_no_series(make_client: AppFactory) -> None:
    """The default (`alarms`): aggregates always, a stream's series only when it alarms; with
    `none`, never."""
    client = make_client()
    for stream in ("pump-1", "pump-2"):
        client.put(f"/v1/streams/{stream}", json={})
    before = samples_of(client)
    assert not [
        name for name, rows in before.items() if any("stream" in labels for labels, _ in rows)
    ]
    assert before["twinwatch_streams"] == [
        ({"state": "ok"}, 2.0),
        ({"state": "alarm"}, 0.0),
        ({"state": "stale"}, 0.0),
    ]
    assert before["twinwatch_readings_accepted_total"] == [({}, 0.0)]

    quiet = make_client(metrics_per_stream="none")
    assert "twinwatch_alarm_active" not in samples_of(quiet)
    assert samples_of(quiet)["twinwatch_streams"][0] == ({"state": "ok"}, 2.0)


def test_each_app_has_its_own_metrics(make_client: AppFactory) -> None:
    first, second = make_client(metrics_per_stream="all"), make_client(metrics_per_stream="all")
    first.put("/v1/streams/only-in-first", json={})
    second_samples = samples_of(second)
    # The second app's registry never saw the first app's PUT (they share the database, so a
    # restart would: it pre-creates series for existing streams at start-up).
    assert "twinwatch_readings_total" not in second_samples
    third = make_client(metrics_per_stream="all")
    assert samples_of(third)["twinwatch_readings_total"] == [({"stream": "only-in-first"}, 0.0)]


def test_first_start_migrates_an_empty_database(empty_database_url: str, tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    write_fake_model(models_dir, "lstm-seed0", thresholds=LAB_LIKE_THRESHOLDS)
    settings = Settings(
        database_url=empty_database_url,
        models_dir=models_dir,
        default_model="lstm-seed0",
        data_dir=tmp_path / "data",
        migrate_on_start=True,
    )
    with TestClient(create_app(settings, artifact_loader=fake_loader)) as client:
        assert client.get("/readyz").status_code == 200
        assert client.put("/v1/streams/pump-1", json={}).status_code == 201
    assert migrations.current(empty_database_url) == (migrations.head(),)
    assert (tmp_path / "data").is_dir()
    engine = create_engine(empty_database_url)
    try:
        assert "streams" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_default_settings_need_nothing_but_a_data_directory(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    write_fake_model(models_dir, "lstm-seed0", thresholds=LAB_LIKE_THRESHOLDS)
    settings = Settings(
        data_dir=tmp_path / "fresh" / "data", models_dir=models_dir, default_model="lstm-seed0"
    )
    assert settings.database_url == f"sqlite:///{tmp_path}/fresh/data/twinwatch.db"
    with TestClient(create_app(settings, artifact_loader=fake_loader)) as client:
        assert client.get("/readyz").status_code == 200
    assert (tmp_path / "fresh" / "data" / "twinwatch.db").is_file()


def test_a_missing_models_directory_starts_but_is_not_ready(
    make_client: AppFactory, tmp_path: Path
) -> None:
    client = make_client(models_dir=tmp_path / "nowhere")
    assert client.get("/v1/models").json() == {"items": []}
    assert client.get("/readyz").status_code == 503
    assert client.put("/v1/streams/pump-1", json={}).status_code == 422


def test_starting_an_app_leaves_the_garbage_collector_alone(make_client: AppFactory) -> None:
    # Tests build many apps in one process: process-wide settings are `twinwatch serve`'s.
    before = (gc.get_threshold(), gc.get_freeze_count())
    make_client()
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_after_startup_runs_once_everything_is_loaded(make_client: AppFactory) -> None:
    events: list[str] = []

    def loader(directory: Path) -> FakeArtifact:
        events.append(f"load {directory.name}")
        return fake_loader(directory)

    client = make_client(artifact_loader=loader, after_startup=lambda: events.append("hook"))
    assert sorted(events[:-1]) == ["load broken", "load lstm-seed0", "load naive-2ch"]
    assert events[-1] == "hook"  # once, before the first request
    assert client.get("/readyz").status_code == 200
    assert events.count("hook") == 1


def test_a_database_outage_while_ingesting_is_a_503_and_moves_nothing(client: TestClient) -> None:
    assert client.put("/v1/streams/pump-1", json={}).status_code == 201

    def readings(first: int, count: int) -> dict[str, Any]:
        return {
            "readings": [
                {"t": 1.7e9 + 0.1 * i, "value": 0.01 * i} for i in range(first, first + count)
            ]
        }

    assert client.post("/v1/streams/pump-1/readings", json=readings(0, 100)).status_code == 200
    state = client.app_state["twinwatch"]
    reachable = state.database.engine
    state.database.sessions.configure(
        bind=create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    )
    refused = client.post("/v1/streams/pump-1/readings", json=readings(100, 10))
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert "safe to re-send" in refused.json()["detail"]
    state.database.sessions.configure(bind=reachable)
    again = client.post("/v1/streams/pump-1/readings", json=readings(100, 10))
    assert again.status_code == 200, again.text
    answer = again.json()
    assert (answer["accepted"], answer["duplicates"]) == (10, 0)
    assert client.get("/v1/streams/pump-1").json()["samples_seen"] == 110
