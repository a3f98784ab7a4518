"""Jobs over HTTP against real artifacts: a recalibration and a retrain each make a candidate
version from a stream's stored readings, in a process of their own; a job can be cancelled;
a service that stops while a job runs fails it; bad requests are refused.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.cli import cli
from app.cli import models as models_cli
from app.errors import AppError
from app.registry import default_loader
from tests.integration.conftest import AppFactory
from tests.support.jobs import finished
from tests.support.models import calibrated_lab_model, epoch_times, lab_series

READINGS = 7000  # lab samples 0..6999: normal operation (the lab's faults start at 7000)


@pytest.fixture(scope="module")
def lab_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    calibrated_lab_model(directory)
    return directory


@pytest.fixture
def service(make_client: AppFactory, lab_models: Path) -> TestClient:
    client = make_client(artifact_loader=default_loader, models_dir=lab_models)
    assert client.put("/v1/streams/pump-1", json={"model": "lstm-seed0"}).status_code == 201
    values = lab_series().value[:READINGS]
    times = epoch_times(0, READINGS)
    body = {
        "readings": [{"t": float(t), "value": float(v)} for t, v in zip(times, values, strict=True)]
    }
    assert client.post("/v1/streams/pump-1/readings?results=false", json=body).status_code == 200
    return client


def test_a_recalibration_makes_a_candidate_a_stream_can_run(service: TestClient) -> None:
    since = float(epoch_times(5000, 5001)[0])
    queued = service.post(
        "/v1/streams/pump-1/jobs",
        json={"kind": "recalibrate", "since": since, "false_alarms_per_day": 2000},
    )
    assert queued.status_code == 202, queued.text
    job = queued.json()
    assert job["phase"] == "queued" and queued.headers["location"] == f"/v1/jobs/{job['id']}"
    done = finished(service, job["id"])
    assert done["phase"] == "succeeded", done["error"]
    assert done["result"]["name"] == "lstm-seed0" and done["result"]["version"] == 2
    version = service.get("/v1/models/lstm-seed0/versions/2").json()
    assert version["status"] == "candidate"
    assert version["created_by"] == f"job {job['id']} (recalibrate)"
    assert version["source"]["stream"] == "pump-1" and version["source"]["from_version"] == 1
    assert version["source"]["readings"] == 2000
    assert version["calibration"]["false_alarms_per_day"] == 2000
    assert {d["kind"] for d in version["thresholds"]["detectors"]} >= {"point", "rolling_rms"}
    switched = service.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 2})
    assert switched.status_code == 200
    point = next(d for d in version["thresholds"]["detectors"] if d["kind"] == "point")
    assert switched.json()["live"]["detectors"]["point"]["threshold"] == point["threshold"]
    assert service.get("/v1/models/lstm-seed0/versions/2").json()["status"] == "active"


def test_a_retrain_trains_the_same_kind_and_reports_its_epochs(service: TestClient) -> None:
    queued = service.post(
        "/v1/streams/pump-1/jobs",
        json={"kind": "retrain", "epochs": 2, "false_alarms_per_day": 2000},
    )
    done = finished(service, queued.json()["id"])
    assert done["phase"] == "succeeded", done["error"]
    assert done["progress"]["step"] == "calibrating"
    version = service.get(f"/v1/models/lstm-seed0/versions/{done['result']['version']}").json()
    assert version["kind"] == "lstm" and version["status"] == "candidate"
    assert version["metrics"]["test"]["samples"] > 0  # scored on readings it never trained on
    assert version["source"]["readings"] == READINGS


def test_a_cancelled_job_makes_no_version(service: TestClient) -> None:
    queued = service.post("/v1/streams/pump-1/jobs", json={"kind": "retrain", "epochs": 500})
    job_id = queued.json()["id"]
    deadline = time.monotonic() + 120
    while service.get(f"/v1/jobs/{job_id}").json()["progress"].get("step") != "training":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = service.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.json()["phase"] == "cancelled"
    runner = service.app_state["twinwatch"].jobs
    deadline = time.monotonic() + 30
    while runner._running is not None:  # its process is ended, not left to train
        assert time.monotonic() < deadline, "the cancelled job's process still runs"
        time.sleep(0.1)
    assert finished(service, job_id)["phase"] == "cancelled"
    assert [v["version"] for v in service.get("/v1/models/lstm-seed0").json()["versions"]] == [1]
    again = service.delete(f"/v1/jobs/{job_id}")
    assert (
        again.status_code == 409 and again.json()["detail"] == f"job {job_id} has cancelled already"
    )


def test_a_job_that_cannot_work_fails_and_says_why(service: TestClient) -> None:
    late = float(epoch_times(6900, 6901)[0])
    queued = service.post("/v1/streams/pump-1/jobs", json={"kind": "recalibrate", "since": late})
    done = finished(service, queued.json()["id"])
    assert done["phase"] == "failed"
    assert "thresholds need at least 500" in done["error"]


def test_a_service_that_stops_fails_the_job_it_ran(
    service: TestClient, make_client: AppFactory, lab_models: Path
) -> None:
    queued = service.post("/v1/streams/pump-1/jobs", json={"kind": "retrain", "epochs": 500})
    job_id = queued.json()["id"]
    while service.get(f"/v1/jobs/{job_id}").json()["phase"] != "running":
        time.sleep(0.1)
    service.__exit__(None, None, None)
    client = make_client(artifact_loader=default_loader, models_dir=lab_models)
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["phase"] == "failed" and job["error"] == "the service stopped while the job ran"
    listed = client.get("/v1/jobs", params={"stream": "pump-1"}).json()
    assert [item["id"] for item in listed["items"]] == [job_id]


def test_bad_job_requests_are_refused(service: TestClient) -> None:
    def ask(stream: str, body: object) -> tuple[int, str]:
        answer = service.post(f"/v1/streams/{stream}/jobs", json=body)
        return answer.status_code, str(answer.json().get("detail", ""))

    service.put("/v1/streams/learner", json={"model": "auto"})
    assert ask("learner", {"kind": "retrain"})[0] == 409
    assert ask("ghost", {"kind": "retrain"})[0] == 404
    assert ask("pump-1", {"kind": "rebuild"})[0] == 422
    assert ask("pump-1", {"kind": "recalibrate", "since": 1.8e9, "until": 1.7e9})[0] == 422
    assert ask("pump-1", {"kind": "recalibrate", "epochs": 3})[0] == 422
    assert ask("pump-1", {"kind": "recalibrate", "false_alarms_per_day": 0})[0] == 422
    service.put("/v1/streams/empty", json={"model": "lstm-seed0"})
    assert ask("empty", {"kind": "recalibrate"}) == (
        422,
        "stream 'empty' has no readings to work on",
    )
    assert service.get("/v1/jobs/999").status_code == 404
    assert service.delete("/v1/jobs/999").status_code == 404


def test_the_cli_lists_follows_and_cancels_jobs(
    service: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models_cli, "_client", lambda url: contextlib.nullcontext(service))
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["jobs", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return " ".join("".join(c if c.isascii() else " " for c in result.output).split())

    job_id = service.post(
        "/v1/streams/pump-1/jobs",
        json={"kind": "retrain", "epochs": 2, "false_alarms_per_day": 2000},
    ).json()["id"]
    assert run("show", str(job_id), "--follow") == (
        f"job {job_id} (retrain of stream pump-1): succeeded made lstm-seed0 version 2"
    )
    assert f"{job_id} pump-1 retrain succeeded" in run("list", "--stream", "pump-1")
    with pytest.raises(AppError, match=f"409: job {job_id} has succeeded already"):
        runner.invoke(cli, ["jobs", "cancel", str(job_id)], catch_exceptions=False)


def test_artifacts_nothing_refers_to_go_at_the_next_start(
    make_client: AppFactory, tmp_path: Path
) -> None:
    """A job that failed or was cancelled after storing its artifact leaves it unnamed: the next
    start removes it once it is an hour old (younger, a job of another service sharing the
    store may be about to name it). Artifacts of versions and of loaded models stay."""
    client = make_client()
    store = tmp_path / "data" / "artifacts"
    named = {v["artifact_sha256"] for v in client.get("/v1/models/lstm-seed0").json()["versions"]}
    assert named and all((store / sha).is_dir() for sha in named)
    hour_ago = time.time() - 3700
    for sha in named:  # (old, and named: they stay)
        os.utime(store / sha, (hour_ago, hour_ago))
    old, fresh = store / ("a" * 64), store / ("b" * 64)
    for orphan in (old, fresh):
        orphan.mkdir()
        (orphan / "manifest.json").write_text("{}")
    os.utime(old, (hour_ago, hour_ago))
    make_client()  # the next start
    deadline = time.monotonic() + 60
    while old.exists():
        assert time.monotonic() < deadline, "the orphan stayed"
        time.sleep(0.05)
    assert fresh.is_dir()
    assert all((store / sha).is_dir() for sha in named)
