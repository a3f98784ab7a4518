"""A learned stream keeps learning through the service: at its relearning time (on its
readings' clock) a `relearn` job learns it again on its history in a process of its own, the
candidate shadows the stream for its proving period, and a `prove` job promotes it (a switch
with its reason) or discards it (retired, its figures kept); a history under a slow fault is
refused, saying why. The schedule is the stream's own (`learning.relearn`), here minutes.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from app.storage.db import Database
from app.storage.repositories import jobs as job_repo
from tests.integration.conftest import AppFactory
from tests.support.jobs import FINISHED, finished
from tests.support.waiting import until

LEARNING = 1000
RELEARN_AFTER_S = 3600.0  # readings 1 s apart: at reading 3,600
PROVING_S = 1800.0
T0 = 1.7e9


def _plan(**learning: Any) -> dict[str, Any]:
    return {
        "model": "auto",
        "learning": {
            "readings": LEARNING,
            "relearn": {"after_s": [RELEARN_AFTER_S], "every_s": None, "proving_s": PROVING_S},
            **learning,
        },
    }


def _post(client: TestClient, values: np.ndarray, first: int, stop: int, **columns: Any) -> None:
    for start in range(first, stop, 2000):
        end = min(stop, start + 2000)
        readings = [
            {"t": T0 + i, "value": float(values[i])}
            | {name: float(column[i]) for name, column in columns.items()}
            for i in range(start, end)
        ]
        answer = client.post("/v1/streams/s/readings?results=false", json={"readings": readings})
        assert answer.status_code == 200, answer.text


def _relearning(client: TestClient) -> dict[str, Any]:
    answer = client.get("/v1/streams/s")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["learned_model"]["relearning"])


def _jobs(client: TestClient, kind: str) -> list[dict[str, Any]]:
    jobs = client.get("/v1/jobs", params={"stream": "s"}).json()["items"]
    return [job for job in jobs if job["kind"] == kind]


def _finished(client: TestClient, kind: str, *, at_least: int) -> list[dict[str, Any]]:
    """The stream's jobs of a kind once there are `at_least` and all have finished."""
    jobs = _jobs(client, kind)
    done = len(jobs) >= at_least and all(job["phase"] in FINISHED for job in jobs)
    return jobs if done else []


def _learned(
    client: TestClient, values: np.ndarray, config: dict[str, Any], **columns: Any
) -> None:
    assert client.put("/v1/streams/s", json=config).status_code == 201
    _post(client, values, 0, LEARNING + 500, **columns)
    until(lambda: client.get("/v1/streams/s").json()["phase"] == "monitoring", "no fit")


def _relearned(client: TestClient, values: np.ndarray, **columns: Any) -> dict[str, Any]:
    """Readings up to the relearning time: the relearn job, finished."""
    _post(client, values, LEARNING + 500, int(RELEARN_AFTER_S) + 1, **columns)
    queued = until(lambda: _jobs(client, "relearn"), "no relearn job")
    return finished(client, queued[0]["id"])


def _proved(client: TestClient, values: np.ndarray, **columns: Any) -> dict[str, Any]:
    """The candidate shadows the stream; readings through its proving period: the proof."""
    proving = until(lambda: _relearning(client)["proving"], "the candidate did not shadow")
    first = int(proving["from_sample"])
    _post(client, values, first, first + int(PROVING_S) + 10, **columns)
    return until(
        lambda: next((j for j in _jobs(client, "prove") if j["phase"] == "succeeded"), None),
        "no proof",
    )


def _sawtooth(count: int, seed: int) -> np.ndarray:
    """A ramp that drops back every 400 readings: longer than a third of the learning
    readings, so only the relearning finds the season that forecasts the drops."""
    rng = np.random.default_rng(seed)
    return (np.arange(count) % 400) / 400 + rng.normal(0, 0.01, count)


def test_a_better_candidate_learned_on_the_history_is_proven_then_promoted(
    make_client: AppFactory,
) -> None:
    client = make_client(default_model="auto", relearning_lstm=False, retired_versions_kept=0)
    values = _sawtooth(8000, 0)
    _learned(client, values, _plan())
    before = client.get("/v1/streams/s").json()
    assert before["learned_model"]["channels"]["value"]["period"] is None
    schedule = _relearning(client)
    assert schedule["next_at"].startswith("2023-11-14T23:13:20")  # T0 + 3,600 s
    relearn = _relearned(client, values)
    assert relearn["phase"] == "succeeded", relearn["error"]
    candidate = relearn["result"]["version"]
    assert _relearning(client)["next_at"] is None  # (every_s null: no more)

    proof = _proved(client, values)
    result = proof["result"]
    assert result["promoted"] is True, result
    assert result["candidate"]["forecast_rmse"] < 0.98 * result["running"]["forecast_rmse"]
    assert result["candidate"]["incidents"] <= result["running"]["incidents"]

    stream = client.get("/v1/streams/s").json()
    assert stream["model_version"] == candidate
    assert stream["switch_reason"].startswith("proved on its readings: forecast error")
    assert stream["learned_model"]["channels"]["value"]["period"] == 400
    assert stream["learned_model"]["relearning"]["proving"] is None
    assert stream["learned_model"]["relearning"]["last"]["promoted"] is True
    assert client.get("/v1/streams/s/shadow").status_code == 404
    versions = {v["version"]: v for v in client.get("/v1/models/auto.s").json()["versions"]}
    assert versions[candidate]["status"] == "active"
    assert versions[candidate]["created_by"].endswith("(relearn)")
    page = client.get("/streams/s")
    assert page.status_code == 200
    assert f"version {candidate} promoted: forecast error" in " ".join(page.text.split())
    # The switch says why; a rollback is the same call as for any version (and its target is
    # kept, however few retired versions are).
    previous = stream["previous_model"]
    assert previous["name"] == "auto.s"
    assert str(previous["version"]) == result["running"]["version"]
    back = client.post("/v1/streams/s/model", json=previous)
    assert back.status_code == 200, back.text
    assert back.json()["model_version"] == previous["version"]
    assert back.json()["switch_reason"] is None  # (asked for)


def test_a_stream_whose_oldest_readings_are_gone_relearns_on_those_kept(
    make_client: AppFactory,
) -> None:
    # Readings older than 1,900 s (by the stream's clock) are removed at its checkpoints: the
    # one at reading 3,500 removes the first row (readings 0-1,499), whichever job runs first.
    client = make_client(
        default_model="auto", relearning_lstm=False, readings_retention_days=1900 / 86_400
    )
    values = _sawtooth(8000, 6)
    values[1100:1130] += 5.0  # a fault: its alarm's readings are removed, its row stays
    _learned(client, values, _plan())
    relearn = _relearned(client, values)
    assert relearn["phase"] == "succeeded", relearn["error"]
    candidate = client.get(f"/v1/models/auto.s/versions/{relearn['result']['version']}").json()
    assert candidate["source"]["readings"] == 3601 - 1500  # (what was kept)
    assert candidate["metrics"]["channels"]["value"]["period"] == 400
    assert _relearning(client)["next_at"] is None  # (counted from its first reading)


def test_a_candidate_that_is_not_better_is_discarded_with_its_figures(
    make_client: AppFactory,
) -> None:
    client = make_client(default_model="auto", relearning_lstm=False)
    values = _ar1(8000, 1)
    _learned(client, values, _plan())
    relearn = _relearned(client, values)
    assert relearn["phase"] == "succeeded", relearn["error"]
    candidate = relearn["result"]["version"]
    proof = _proved(client, values)
    assert proof["result"]["promoted"] is False, proof["result"]
    assert "not clearly below" in proof["result"]["reason"]
    stream = client.get("/v1/streams/s").json()
    assert stream["model_version"] != candidate  # (its thresholds' revisions are versions too)
    last = stream["learned_model"]["relearning"]["last"]
    assert last["kind"] == "prove" and last["promoted"] is False
    assert last["running"]["forecast_rmse"] > 0 and last["candidate"]["forecast_rmse"] > 0
    versions = {v["version"]: v for v in client.get("/v1/models/auto.s").json()["versions"]}
    assert versions[candidate]["status"] == "retired"


def _ar1(count: int, seed: int) -> np.ndarray:
    """An AR(1): a history teaches nothing its first hour did not."""
    rng = np.random.default_rng(seed)
    values = np.zeros(count)
    for i in range(1, count):
        values[i] = 0.5 * values[i - 1] + rng.normal()
    return values


def test_retired_versions_beyond_the_limit_go_with_their_artifacts(
    make_client: AppFactory, tmp_path: Path
) -> None:
    client = make_client(default_model="auto", relearning_lstm=False, retired_versions_kept=0)
    values = _ar1(8000, 4)
    _learned(client, values, _plan())
    candidate = _relearned(client, values)["result"]["version"]
    sha = client.get(f"/v1/models/auto.s/versions/{candidate}").json()["artifact_sha256"]
    artifact = tmp_path / "data" / "artifacts" / sha
    assert artifact.is_dir()
    assert _proved(client, values)["result"]["promoted"] is False
    assert client.get(f"/v1/models/auto.s/versions/{candidate}").status_code == 404
    assert not artifact.exists()
    running = client.get("/v1/streams/s").json()["model_version"]
    statuses = {
        v["version"]: v["status"] for v in client.get("/v1/models/auto.s").json()["versions"]
    }
    assert statuses == {running: "active"}  # (its revisions' retired versions went too)


def test_a_history_under_a_slow_drift_is_refused_and_says_why(make_client: AppFactory) -> None:
    client = make_client(default_model="auto", relearning_lstm=False)
    rng = np.random.default_rng(2)
    reference = np.sin(np.arange(8000) / 30)
    drift = np.clip((np.arange(8000) - 2000) / 1600, 0, None) * 0.05  # under any threshold
    values = reference + rng.normal(0, 0.05, 8000) + drift
    config = _plan() | {"has_reference": True}
    _learned(client, values, config, reference=reference)
    relearn = _relearned(client, values, reference=reference)
    assert relearn["phase"] == "failed"
    assert "slow fault may be under way" in relearn["error"], relearn["error"]
    assert _relearning(client)["last"]["error"] == relearn["error"]
    assert "slow fault may be under way" in client.get("/streams/s").text
    assert _relearning(client)["proving"] is None
    assert len(client.get("/v1/models/auto.s").json()["versions"]) == 1 + len(
        _jobs(client, "revise")
    )


def test_a_user_s_shadow_stays_and_relearnings_do_not_pile_up(make_client: AppFactory) -> None:
    client = make_client(default_model="auto", relearning_lstm=False)
    values = _ar1(12_000, 5)
    config = _plan()
    config["learning"]["relearn"] = {"after_s": [RELEARN_AFTER_S], "every_s": 300.0}
    _learned(client, values, config)
    mine = client.put("/v1/streams/s/shadow", json={"name": "auto.s", "version": 1})
    assert mine.status_code == 200, mine.text
    relearn = _relearned(client, values)
    assert relearn["phase"] == "succeeded", relearn["error"]
    assert relearn["result"]["proving"].startswith("not proved: the stream is shadowed")
    candidate = relearn["result"]["version"]
    assert client.get(f"/v1/models/auto.s/versions/{candidate}").json()["status"] == "retired"
    assert client.get("/v1/streams/s/shadow").json()["candidate"]["version"] == "1"
    assert _relearning(client)["proving"] is None
    # Every 300 s after: relearnings due while one is queued or running are not queued again.
    _post(client, values, int(RELEARN_AFTER_S) + 1, 12_000)
    # The learning thread queues the next one after the readings are answered: wait for it.
    later = until(lambda: _finished(client, "relearn", at_least=2), "no second relearning")
    assert len(later) <= (12_000 - int(RELEARN_AFTER_S)) // 300
    assert client.get("/v1/streams/s/shadow").json()["candidate"]["version"] == "1"


def test_a_relearning_a_stop_interrupted_runs_again_after_the_restart(
    make_client: AppFactory, database: Database
) -> None:
    """A relearning is the service's own, on a schedule that has moved on once it was queued:
    one a stop cut short is queued again at the next start (a user's job stays failed)."""
    values = _sawtooth(3000, 7)
    _learned(make_client(default_model="auto", relearning_lstm=False), values, _plan())
    with database.session() as session:  # what a stop leaves behind
        now = datetime.now(UTC)
        for kind in ("relearn", "retrain"):
            job_repo.create(
                session, stream_id="s", kind=kind, params={"readings": 1500}, now=now, running=True
            )
        job_repo.fail_interrupted(session, now=now)
    client = make_client(default_model="auto", relearning_lstm=False)  # the restart
    interrupted, again = sorted(_jobs(client, "relearn"), key=lambda job: int(job["id"]))
    assert interrupted["phase"] == "failed"
    again = finished(client, again["id"])
    assert again["phase"] == "succeeded", again["error"]
    assert again["params"] == {"readings": 1500, "again_of": interrupted["id"]}
    assert _relearning(client)["proving"] is not None
    assert [job["phase"] for job in _jobs(client, "retrain")] == ["failed"]
    # Once: a relearning run again and cut short again (it may take the service down with it)
    # waits for the stream's next one; and none runs again with relearning off.
    cases = (({"readings": 1500, "again_of": again["id"]}, True), ({"readings": 1500}, False))
    for params, relearning in cases:
        with database.session() as session:
            job_repo.create(
                session, stream_id="s", kind="relearn", params=params, now=now, running=True
            )
            job_repo.fail_interrupted(session, now=now)
        restarted = make_client(default_model="auto", relearning=relearning)
        latest = max(_jobs(restarted, "relearn"), key=lambda job: int(job["id"]))
        assert latest["phase"] == "failed" and latest["params"] == params, latest


def test_a_bad_schedule_is_refused_and_changes_nothing(make_client: AppFactory) -> None:
    client = make_client(default_model="auto")
    _learned(client, _sawtooth(3000, 7), _plan())
    before = client.get("/v1/streams/s").json()
    for relearn in (True, {"after_s": [-1]}, {"proving_s": 0}, {"every_s": "weekly"}, [3600]):
        config = _plan()
        config["learning"]["relearn"] = relearn
        answer = client.put("/v1/streams/s", json=config)
        assert answer.status_code == 422, (relearn, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
    after = client.get("/v1/streams/s").json()
    assert after["learned_model"]["relearning"] == before["learned_model"]["relearning"]
    assert after["updated_at"] == before["updated_at"]


def test_relearning_is_off_by_the_stream_or_by_the_service(make_client: AppFactory) -> None:
    values = _sawtooth(3000, 3)
    off = make_client(default_model="auto", relearning=False)
    _learned(off, values, _plan())
    assert _relearning(off)["next_at"] is None
    # A service started with relearning on gives it its schedule.
    on = make_client(default_model="auto")
    assert _relearning(on)["next_at"].startswith("2023-11-14T23:13:20")
    assert on.delete("/v1/streams/s").status_code == 204
    config = _plan()
    config["learning"]["relearn"] = False
    _learned(on, values, config)
    assert _relearning(on)["next_at"] is None
    # A stream that learned takes a new schedule (its model stays).
    assert on.put("/v1/streams/s", json=_plan()).status_code == 200
    assert _relearning(on)["next_at"].startswith("2023-11-14T23:13:20")
    assert on.get("/v1/streams/s").json()["phase"] == "monitoring"
