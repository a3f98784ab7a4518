"""Model versions: a models directory's artifact is a numbered version of its name, a stream
switches to a version (promote) and back (roll back) without losing or doubling a reading, and
every alarm names the version that raised it.

Runs against SQLite and, when configured, PostgreSQL (the `database` fixture).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.cli import cli
from app.cli import models as models_cli
from app.errors import AppError
from tests.integration.conftest import LAB_LIKE_THRESHOLDS, T0, AppFactory, write_fake_model

NEVER = {"detectors": [{"kind": "point", "threshold": 1e9}]}


def readings(first: int, count: int, *, swing: float = 0.0) -> dict[str, Any]:
    """Readings `first`.. of a flat signal; with `swing`, every other one is `swing` higher
    (each residual of the persistence forecast is then `swing`: the point detector alarms)."""
    return {
        "readings": [
            {"t": T0.timestamp() + i / 10, "value": swing * (i % 2)}
            for i in range(first, first + count)
        ]
    }


def restart(make_client: AppFactory, client: TestClient | None = None) -> TestClient:
    if client is not None:
        client.__exit__(None, None, None)
    return make_client()


def versions(client: TestClient, name: str = "lstm-seed0") -> dict[int, str]:
    body = client.get(f"/v1/models/{name}").json()
    return {row["version"]: row["status"] for row in body["versions"]}


def test_a_models_directory_holds_a_version_and_a_changed_one_the_next(
    make_client: AppFactory, models_dir: Path
) -> None:
    client = make_client()
    model = client.get("/v1/models/lstm-seed0").json()
    assert model["active_version"] == 1 and model["version"] == "1"
    (first,) = model["versions"]
    assert first["status"] == "active" and first["created_by"] == "models directory"
    assert first["source"] == {"directory": str(models_dir / "lstm-seed0")}
    assert client.get("/v1/models/lstm-seed0/versions/1").json() == first

    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)  # a new artifact
    client = restart(make_client, client)
    assert client.get("/v1/models/lstm-seed0").json()["active_version"] == 2
    assert versions(client) == {1: "retired", 2: "active"}
    client = restart(make_client, client)  # the same artifact: no new version
    assert versions(client) == {1: "retired", 2: "active"}

    write_fake_model(
        models_dir, "lstm-seed0", thresholds=LAB_LIKE_THRESHOLDS, metrics={"rmse": 0.133}
    )
    client = restart(make_client, client)  # back to the first artifact: version 1 again
    assert client.get("/v1/models/lstm-seed0").json()["active_version"] == 1
    assert versions(client) == {1: "active", 2: "retired"}

    missing = client.get("/v1/models/lstm-seed0/versions/3")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "model 'lstm-seed0' has no version 3"
    assert client.get("/v1/models/nothing-here").status_code == 404


def test_promote_then_roll_back_a_stream(make_client: AppFactory, models_dir: Path) -> None:
    """Version 1 alarms on the swing, version 2 never does. The stream runs the active
    version (2), is promoted to 1 (its alarms name version 1), then rolled back to 2 (the
    alarm closes at the switch); a restart keeps the version it runs."""
    client = make_client()  # version 1: the lab-like thresholds
    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)
    client = restart(make_client, client)  # version 2, active
    assert client.put("/v1/streams/pump-1", json={}).json()["model_version"] is None
    quiet = client.post("/v1/streams/pump-1/readings", json=readings(0, 60, swing=5.0))
    assert quiet.status_code == 200 and quiet.json()["opened"] == []

    promoted = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 1})
    assert promoted.status_code == 200, promoted.text
    body = promoted.json()
    assert body["model_version"] == 1 and body["samples_seen"] == 60
    assert body["live"]["warmup_remaining"] == 0  # warmed on the stored readings
    assert body["live"]["detectors"]["point"]["threshold"] == 0.525
    assert versions(client) == {1: "active", 2: "active"}  # 2 is still the default

    loud = client.post("/v1/streams/pump-1/readings", json=readings(60, 40, swing=5.0)).json()
    assert [alarm["detector"] for alarm in loud["opened"]]
    (alarm,) = [a for a in loud["opened"] if a["detector"] == "point"]
    assert alarm["model_version"] == "1" and alarm["opened_sample"] >= 60

    rolled = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 2})
    assert rolled.status_code == 200 and rolled.json()["open_alarms"] == []
    closed = client.get(f"/v1/alarms/{alarm['id']}").json()
    assert closed["state"] == "closed" and closed["closed_sample"] == 100

    client = restart(make_client, client)
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["model_version"] == 2 and stream["samples_seen"] == 100
    after = client.post("/v1/streams/pump-1/readings", json=readings(100, 40, swing=5.0)).json()
    assert after["accepted"] == 40 and after["opened"] == []
    assert versions(client) == {1: "retired", 2: "active"}


def test_readings_posted_during_switches_are_each_processed_once(
    make_client: AppFactory, models_dir: Path
) -> None:
    client = make_client()
    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)
    client = restart(make_client, client)
    client.put("/v1/streams/pump-1", json={})
    answers: list[int] = []

    def post() -> None:
        for first in range(0, 400, 10):
            answer = client.post("/v1/streams/pump-1/readings", json=readings(first, 10))
            answers.append(answer.json()["accepted"])

    poster = threading.Thread(target=post)
    poster.start()
    for switch in range(20):
        switched = client.post(
            "/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 1 + switch % 2}
        )
        assert switched.status_code == 200, switched.text
    poster.join()
    assert answers == [10] * 40
    stream = client.get("/v1/streams/pump-1").json()
    assert stream["samples_seen"] == 400
    again = client.post("/v1/streams/pump-1/readings", json=readings(390, 10))
    assert again.json()["duplicates"] == 10  # all stored once


def test_a_switch_that_cannot_be_made_says_why(make_client: AppFactory) -> None:
    client = make_client()
    client.put("/v1/streams/pump-1", json={})
    client.put("/v1/streams/learner", json={"model": "auto"})

    def switch(stream: str, body: object) -> tuple[int, str]:
        answer = client.post(f"/v1/streams/{stream}/model", json=body)
        return answer.status_code, answer.json().get("detail", "")

    assert switch("pump-1", {"name": "lstm-seed0", "version": 7}) == (
        404,
        "model 'lstm-seed0' has no version 7",
    )
    assert switch("ghost", {"name": "lstm-seed0", "version": 1}) == (
        404,
        "stream 'ghost' does not exist",
    )
    assert switch("pump-1", {"name": "naive-2ch", "version": 1}) == (
        422,
        "model 'naive-2ch' takes 2 channel(s), stream 'pump-1' has 1",
    )
    assert switch("learner", {"name": "lstm-seed0", "version": 1}) == (
        409,
        "stream 'learner' learns its own model: it runs only the versions of 'auto.learner', "
        "not a trained model",
    )
    assert switch("pump-1", {"name": "lstm-seed0", "version": "1"})[0] == 422  # strict
    assert switch("pump-1", {"name": "lstm-seed0", "version": 1, "extra": 1})[0] == 422
    bad_json = client.post(
        "/v1/streams/pump-1/model",
        content=b"{",
        headers={"content-type": "application/json"},
    )
    assert bad_json.status_code == 400
    assert client.get("/v1/streams/pump-1").json()["model_version"] is None


def test_a_stream_remembers_what_it_ran_before_its_last_switch(
    make_client: AppFactory, models_dir: Path
) -> None:
    client = make_client()
    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)
    client = restart(make_client, client)  # versions 1 and 2 (active)
    client.put("/v1/streams/pump-1", json={})
    assert client.get("/v1/streams/pump-1").json()["previous_model"] is None
    client.post("/v1/streams/pump-1/readings", json=readings(0, 30))
    same = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 2})
    assert same.status_code == 409
    assert same.json()["detail"] == "stream 'pump-1' runs lstm-seed0 version 2 already"
    switched = client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 1})
    assert switched.json()["previous_model"] == {"name": "lstm-seed0", "version": 2}
    assert client.get("/v1/streams/pump-1").json()["previous_model"] == {
        "name": "lstm-seed0",
        "version": 2,
    }


def test_the_cli_lists_shows_promotes_and_rolls_back(
    make_client: AppFactory, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client()
    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)
    client = restart(make_client, client)
    client.put("/v1/streams/pump-1", json={})
    monkeypatch.setattr(models_cli, "_client", lambda url: contextlib.nullcontext(client))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, ["models", *args], catch_exceptions=False)
        text = "".join(c if c.isascii() else " " for c in result.output)  # no table borders
        return result.exit_code, " ".join(text.split())

    code, listed = run("list")
    assert code == 0 and "lstm-seed0 2 naive" in listed
    code, shown = run("show", "lstm-seed0")
    assert code == 0 and "active version 2" in shown
    assert "1 retired" in shown and "2 active" in shown
    assert run("promote", "pump-1", "lstm-seed0", "1") == (
        0,
        "stream pump-1 runs lstm-seed0 version 1 from its next reading on "
        "(before: lstm-seed0 version 2)",
    )
    assert run("rollback", "pump-1") == (
        0,
        "stream pump-1 runs lstm-seed0 version 2 from its next reading on "
        "(before: lstm-seed0 version 1)",
    )
    assert client.get("/v1/streams/pump-1").json()["model_version"] == 2
    client.put("/v1/streams/pump-2", json={})
    with pytest.raises(AppError, match="stream 'pump-2' never switched models"):
        runner.invoke(cli, ["models", "rollback", "pump-2"], catch_exceptions=False)
    with pytest.raises(AppError, match="404: model 'lstm-seed0' has no version 9"):
        runner.invoke(
            cli, ["models", "promote", "pump-1", "lstm-seed0", "9"], catch_exceptions=False
        )


def test_a_shadow_sees_the_readings_and_raises_nothing(
    make_client: AppFactory, models_dir: Path
) -> None:
    client = make_client()  # version 1 alarms on the swing
    write_fake_model(models_dir, "lstm-seed0", thresholds=NEVER)
    client = restart(make_client, client)  # version 2 (never alarms), active
    client.put("/v1/streams/pump-1", json={})
    client.post("/v1/streams/pump-1/readings", json=readings(0, 60))
    started = client.put("/v1/streams/pump-1/shadow", json={"name": "lstm-seed0", "version": 1})
    assert started.status_code == 200, started.text
    assert started.json()["from_sample"] == 60 and started.json()["readings"] == 0

    answer = client.post("/v1/streams/pump-1/readings", json=readings(60, 40, swing=5.0)).json()
    assert answer["opened"] == []  # the stream runs version 2
    compared = client.get("/v1/streams/pump-1/shadow").json()
    assert compared["readings"] == 40
    assert compared["since_t"] == T0.timestamp() + 6.0
    active, candidate = compared["active"], compared["candidate"]
    assert (active["version"], candidate["version"]) == ("2", "1")
    assert active["alarms"] == 0 and candidate["alarms"] >= 1
    assert {d["detector"] for d in candidate["detections"]} >= {"point"}
    assert candidate["detections"][0]["start_t"] >= T0.timestamp() + 6.0
    # The same forecaster: the same residuals (0 at the first reading, then 5 either way).
    assert (
        active["residual_rmse"] == candidate["residual_rmse"] == pytest.approx(5 * (39 / 40) ** 0.5)
    )
    assert client.get("/v1/alarms", params={"stream": "pump-1"}).json()["items"] == []

    client = restart(make_client, client)  # the shadow stays
    assert client.get("/v1/streams/pump-1/shadow").json()["readings"] == 40
    client.post("/v1/streams/pump-1/model", json={"name": "lstm-seed0", "version": 1})
    assert client.get("/v1/streams/pump-1/shadow").status_code == 404  # promoted: it runs


def test_a_shadow_that_cannot_be_says_why(make_client: AppFactory) -> None:
    client = make_client()
    client.put("/v1/streams/pump-1", json={})
    client.put("/v1/streams/learner", json={"model": "auto"})
    one = {"name": "lstm-seed0", "version": 1}
    assert client.put("/v1/streams/learner/shadow", json=one).status_code == 409
    missing = client.put("/v1/streams/pump-1/shadow", json={"name": "lstm-seed0", "version": 4})
    assert missing.status_code == 404
    assert client.get("/v1/streams/pump-1/shadow").status_code == 404
    assert client.delete("/v1/streams/pump-1/shadow").status_code == 404
    assert client.put("/v1/streams/pump-1/shadow", json=one).status_code == 200
    assert client.delete("/v1/streams/pump-1/shadow").status_code == 204
    assert client.get("/v1/streams/pump-1/shadow").json()["detail"] == (
        "stream 'pump-1' has no shadow"
    )
