"""Streams of model "auto": they learn from their first readings, off the request path, and
monitor every reading in order once they have learned, none lost or skipped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import app.streams.learner as learning_module
from app.schemas import MAX_CHANNELS
from tests.integration.conftest import AppFactory

START = 1_700_000_000.0


def readings(values: np.ndarray, first: int, *, channels: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {
            "t": START + first + i,
            "values": {
                name: None if np.isnan(v) else float(v)
                for name, v in zip(channels, row, strict=True)
            },
        }
        for i, row in enumerate(values)
    ]


def normal(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flow = 30 + rng.normal(0, 0.5, count)
    temperature = 60 + np.cumsum(rng.normal(0, 0.05, count))
    return np.column_stack([flow, temperature])


def jobs(client: TestClient, stream: str) -> list[dict[str, Any]]:
    """The stream's jobs, oldest first."""
    items = client.get("/v1/jobs", params={"stream": stream}).json()["items"]
    return list(reversed(items))


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


CHANNELS = ("flow", "temperature")


@pytest.fixture
def auto_client(make_client: AppFactory) -> TestClient:
    return make_client(default_model="auto")


def hold_the_fit(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the next fits wait until `release` is set; `started` is set when one begins."""
    release, started = threading.Event(), threading.Event()
    real_learn = learning_module.learn

    def slow_learn(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(30)
        return real_learn(*args, **kwargs)

    monkeypatch.setattr(learning_module, "learn", slow_learn)
    return release, started


def test_a_stream_learns_while_readings_keep_coming_and_monitors_each_of_them(
    auto_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = auto_client
    put = client.put(
        "/v1/streams/pump", json={"channels": list(CHANNELS), "learning": {"readings": 300}}
    )
    assert put.status_code == 201, put.text
    body = put.json()
    assert (body["model"], body["phase"], body["learning_remaining"]) == ("auto", "learning", 300)
    assert body["sample_period_s"] is None

    # Hold the fit until the test says so: readings arrive while it runs.
    release, started = hold_the_fit(monkeypatch)

    data = normal(600)
    data[420:470, 0] -= 5.0  # the flow drops while the model is being fitted
    posted = 0
    for size in (250, 40, 10):
        answer = client.post(
            "/v1/streams/pump/readings",
            json={"readings": readings(data[posted : posted + size], posted, channels=CHANNELS)},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["opened"] == []
        posted += size
    assert started.wait(10)
    during = client.get("/v1/streams/pump").json()
    assert during["phase"] == "learning" and during["learning"]["fitting"] is True
    assert during["learning_remaining"] == 0
    while posted < 500:  # throughout the fit
        answer = client.post(
            "/v1/streams/pump/readings",
            json={"readings": readings(data[posted : posted + 25], posted, channels=CHANNELS)},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["opened"] == []  # not monitored yet: queued behind the fit
        posted += 25
    release.set()
    wait_for(lambda: client.get("/v1/streams/pump").json()["phase"] == "monitoring")

    stream = client.get("/v1/streams/pump").json()
    assert stream["samples_seen"] == 500
    assert stream["sample_period_s"] == pytest.approx(1.0)
    learned = stream["learned_model"]
    assert learned["learned_from"] == 300
    assert set(learned["channels"]) == set(CHANNELS)
    assert learned["channels"]["flow"]["kind"] in {"level", "ar"}
    assert learned["channels"]["temperature"]["kind"] in {"naive", "ar-differenced"}
    for summary in learned["channels"].values():
        assert summary["validation_rmse"] > 0 and summary["naive_rmse"] > 0
    assert learned["lstm"] == "not tried: the LSTM candidate forecasts streams of one channel"

    # The drop that arrived during the fit was monitored once the model was there.
    alarms = client.get("/v1/alarms", params={"stream": "pump"}).json()["items"]
    assert alarms, "the flow drop raised no alarm"
    assert min(a["opened_sample"] for a in alarms) >= 420
    # They name what the stream learned: version 1 of its learned models.
    assert all(a["model"] == "auto.pump" and a["model_version"] == "1" for a in alarms)
    assert stream["model"] == "auto" and stream["model_version"] == 1
    catalogued = client.get("/v1/models/auto.pump").json()
    assert catalogued["kind"] == "learned" and catalogued["active_version"] == 1
    (version,) = catalogued["versions"]
    assert version["status"] == "active" and version["created_by"] == "learning"
    assert version["source"] == {"stream": "pump", "first_sample": 0, "readings": 300}

    # And monitoring goes on with the next readings.
    answer = client.post(
        "/v1/streams/pump/readings",
        json={"readings": readings(data[500:600], 500, channels=CHANNELS)},
    )
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert all(r["forecast"] is not None for r in results)
    assert client.get("/v1/streams/pump").json()["samples_seen"] == 600


def test_a_stream_learns_for_a_duration(auto_client: TestClient) -> None:
    client = auto_client
    client.put("/v1/streams/d", json={"learning": {"duration_s": 150}})
    values = 5 + np.random.default_rng(1).normal(0, 1, 400)
    body = [{"t": START + 0.5 * i, "value": float(v)} for i, v in enumerate(values)]
    assert client.post("/v1/streams/d/readings", json={"readings": body}).status_code == 200
    wait_for(lambda: client.get("/v1/streams/d").json()["phase"] == "monitoring")
    stream = client.get("/v1/streams/d").json()
    assert stream["learned_model"]["learned_from"] == 300  # 150 s of readings every 0.5 s
    assert stream["sample_period_s"] == pytest.approx(0.5)


def test_a_stream_that_cannot_learn_says_why_and_a_put_tries_again(
    auto_client: TestClient,
) -> None:
    client = auto_client
    client.put("/v1/streams/s", json={"channels": ["a", "b"], "learning": {"readings": 100}})
    rows = [{"t": START + i, "values": {"a": float(i % 7), "b": None}} for i in range(120)]
    assert client.post("/v1/streams/s/readings", json={"readings": rows}).status_code == 200
    wait_for(lambda: client.get("/v1/streams/s").json()["learning"]["error"] is not None)
    stream = client.get("/v1/streams/s").json()
    assert stream["phase"] == "learning"
    assert "channel 1 has no number" in stream["learning"]["error"]
    (job,) = jobs(client, "s")
    assert (job["kind"], job["phase"], job["params"]) == ("learn", "failed", {"readings": 100})
    assert "channel 1 has no number" in job["error"]
    # Reconfigured (one channel would not pass: the channels of a stream with readings are
    # fixed), the stream tries again, and fails the same way: it still says why.
    again = client.put(
        "/v1/streams/s", json={"channels": ["a", "b"], "learning": {"readings": 110}}
    )
    assert again.status_code == 200
    wait_for(lambda: client.get("/v1/streams/s").json()["learning"]["error"] is not None)


def test_learning_is_for_auto_streams_only_and_checked(auto_client: TestClient) -> None:
    client = auto_client
    named = client.put("/v1/streams/n", json={"model": "lstm-seed0", "learning": {"readings": 500}})
    assert named.status_code == 422
    assert "learning" in named.json()["detail"]
    short = client.put("/v1/streams/n", json={"learning": {"readings": 10}})
    assert short.status_code == 422
    both = client.put("/v1/streams/n", json={"learning": {"readings": 500, "duration_s": 60}})
    assert both.status_code == 422
    budget = client.put("/v1/streams/n", json={"false_alarms_per_day": 0})
    assert budget.status_code == 422


def test_a_restart_during_the_fit_fits_again(make_client: AppFactory) -> None:
    first = make_client(default_model="auto")
    first.put("/v1/streams/r", json={"learning": {"readings": 100}})
    values = 5 + np.random.default_rng(2).normal(0, 1, 150)
    body = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    assert first.post("/v1/streams/r/readings", json={"readings": body}).status_code == 200
    first.__exit__(None, None, None)  # stops (a fit in progress is finished or done again)
    second = make_client(default_model="auto")
    wait_for(lambda: second.get("/v1/streams/r").json()["phase"] == "monitoring")
    assert second.get("/v1/streams/r").json()["samples_seen"] == 150


def test_the_learning_phase_alarms_end_with_it_and_so_do_their_incidents(
    auto_client: TestClient,
) -> None:
    client = auto_client
    client.put("/v1/streams/m", json={"learning": {"readings": 200}})
    values = 5 + np.random.default_rng(4).normal(0, 1, 400)
    rows = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    for row in rows[195:200]:
        row["value"] = None  # the last learning readings go missing: a missing alarm
    assert client.post("/v1/streams/m/readings", json={"readings": rows[:100]}).status_code == 200
    assert client.get("/v1/streams/m/forecast").status_code == 409  # still learning
    assert (
        client.post("/v1/streams/m/readings", json={"readings": rows[100:200]}).status_code == 200
    )
    (missing,) = client.get("/v1/alarms", params={"stream": "m"}).json()["items"]
    assert (missing["detector"], missing["opened_sample"]) == ("missing", 197)
    rows[300]["value"] = 40.0  # a spike long after
    assert client.post("/v1/streams/m/readings", json={"readings": rows[200:]}).status_code == 200
    wait_for(lambda: client.get("/v1/streams/m").json()["phase"] == "monitoring")
    alarms = client.get("/v1/alarms", params={"stream": "m"}).json()["items"]
    first = next(a for a in alarms if a["id"] == missing["id"])
    assert (first["state"], first["closed_sample"]) == ("closed", 200)
    incidents = client.get("/v1/incidents", params={"stream": "m"}).json()["items"]
    by_id = {i["id"]: i for i in incidents}
    assert by_id[first["incident"]]["state"] == "closed"
    spike = [a for a in alarms if a["opened_sample"] == 300]
    assert spike and spike[0]["incident"] != first["incident"]
    listed = {s["id"]: s for s in client.get("/v1/streams").json()["items"]}
    assert listed["m"]["phase"] == "monitoring" and listed["m"]["learned_model"] is not None
    assert client.get("/v1/streams/m/forecast").status_code == 200


def test_a_reconfiguration_during_the_fit_fits_again(
    auto_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = auto_client
    release, started = hold_the_fit(monkeypatch)
    client.put("/v1/streams/r", json={"learning": {"readings": 150}})
    values = 5 + np.random.default_rng(5).normal(0, 1, 300)
    rows = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    assert client.post("/v1/streams/r/readings", json={"readings": rows}).status_code == 200
    assert started.wait(10)
    assert client.put("/v1/streams/r", json={"learning": {"readings": 250}}).status_code == 200
    release.set()
    wait_for(lambda: client.get("/v1/streams/r").json()["phase"] == "monitoring")
    assert client.get("/v1/streams/r").json()["learned_model"]["learned_from"] == 250
    # The fit the change overtook says so; the one after it made version 1.
    superseded, done = jobs(client, "r")
    assert superseded["phase"] == "cancelled" and superseded["error"].startswith("superseded")
    assert done["phase"] == "succeeded" and done["params"] == {"readings": 250}
    assert done["result"] == {"name": "auto.r", "version": 1}


def test_a_learning_streams_overrides_name_detectors_it_may_get(auto_client: TestClient) -> None:
    client = auto_client
    unknown = client.put("/v1/streams/o", json={"detectors": {"cusum": {"enabled": False}}})
    assert unknown.status_code == 422 and "cusum" in unknown.json()["detail"]
    kinds = ("point", "shift", "rolling_rms", "frozen", "mahalanobis", "level", "missing")
    every = {kind: {"enabled": False} for kind in kinds}
    assert client.put("/v1/streams/o", json={"detectors": every}).status_code == 422
    named = client.put("/v1/streams/o", json={"model": "lstm-seed0", "false_alarms_per_day": 2})
    assert named.status_code == 422


def test_thresholds_are_revised_on_normal_readings_and_survive_a_restart(
    make_client: AppFactory,
) -> None:
    client = make_client(default_model="auto")
    client.put("/v1/streams/v", json={"learning": {"readings": 100}})
    values = 5 + np.random.default_rng(6).normal(0, 1, 1400)
    rows = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    assert client.post("/v1/streams/v/readings", json={"readings": rows[:100]}).status_code == 200
    wait_for(lambda: client.get("/v1/streams/v").json()["phase"] == "monitoring")
    before = client.get("/v1/streams/v").json()["live"]["detectors"]
    assert (
        client.post("/v1/streams/v/readings", json={"readings": rows[100:1200]}).status_code == 200
    )
    wait_for(lambda: client.get("/v1/streams/v").json()["learned_model"]["revisions"] == 1)
    learn, revise = jobs(client, "v")
    assert (learn["kind"], learn["result"]) == ("learn", {"name": "auto.v", "version": 1})
    assert (revise["kind"], revise["result"]) == ("revise", {"name": "auto.v", "version": 2})
    assert revise["params"] == {"from_sample": 100} and revise["phase"] == "succeeded"
    cancel = client.delete(f"/v1/jobs/{revise['id']}")
    assert cancel.status_code == 409
    assert cancel.json()["detail"] == (
        f"job {revise['id']} is a learning stream's revise: the service runs it to its end"
    )
    learned = client.get("/v1/streams/v").json()["learned_model"]
    assert learned["thresholds_from"] == 1200  # from the next reading on
    after = client.get("/v1/streams/v").json()["live"]["detectors"]
    assert set(after) == set(before)
    client.__exit__(None, None, None)
    again = make_client(default_model="auto")
    assert again.post("/v1/streams/v/readings", json={"readings": rows[1200:]}).status_code == 200
    stream = again.get("/v1/streams/v").json()
    assert stream["samples_seen"] == 1400 and stream["learned_model"]["revisions"] == 1
    # The revision is version 2 of the stream's learned models, and runs; version 1 retired.
    assert stream["model_version"] == 2
    versions = again.get("/v1/models/auto.v").json()["versions"]
    assert [(v["version"], v["status"], v["created_by"]) for v in versions] == [
        (1, "retired", "learning"),
        (2, "active", "revision"),
    ]
    assert versions[1]["source"] == {"stream": "v", "from_sample": 1200}


def test_a_fit_is_not_adopted_by_a_process_that_no_longer_holds_the_stream(
    auto_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the bus a worker adopts a fit only while it holds the stream's partition (its
    `owns` check, in the adopting transaction): one that lost it meanwhile writes nothing,
    and the stream's new holder fits it again."""
    client = auto_client
    put = client.put(
        "/v1/streams/pump", json={"channels": list(CHANNELS), "learning": {"readings": 300}}
    )
    assert put.status_code == 201, put.text
    release, started = hold_the_fit(monkeypatch)
    answer = client.post(
        "/v1/streams/pump/readings", json={"readings": readings(normal(300), 0, channels=CHANNELS)}
    )
    assert answer.status_code == 200, answer.text
    assert started.wait(10)
    streams = client.app_state["twinwatch"].streams
    asked: list[str] = []

    def lost(_session: Any, stream_id: str) -> bool:
        asked.append(stream_id)
        return False

    streams.owns = lost
    release.set()
    wait_for(lambda: asked == ["pump"])
    time.sleep(0.2)  # (the fit's transaction ends)
    stream = client.get("/v1/streams/pump").json()
    assert stream["phase"] == "learning" and stream["learned_model"] is None
    assert client.get("/v1/models/auto.pump").status_code == 404


def test_a_stream_of_the_most_channels_learns_and_names_a_constant_one(
    auto_client: TestClient,
) -> None:
    client = auto_client
    names = tuple(f"v{c:03d}" for c in range(MAX_CHANNELS))
    too_many = [*names, "one more"]
    assert client.put("/v1/streams/w", json={"channels": too_many}).status_code == 422
    put = client.put("/v1/streams/w", json={"channels": list(names), "learning": {"readings": 300}})
    assert put.status_code in (200, 201), put.text
    rng = np.random.default_rng(3)
    values = 10 + rng.normal(0, 1, (300, MAX_CHANNELS)).cumsum(axis=0) * 0.1
    values[:, 7] = 1.0  # a set point that never moved
    body = {"readings": readings(values, 0, channels=names)}
    assert client.post("/v1/streams/w/readings", json=body).status_code == 200
    wait_for(lambda: client.get("/v1/streams/w").json()["phase"] == "monitoring", 120)
    channels = client.get("/v1/streams/w").json()["learned_model"]["channels"]
    assert [name for name, channel in channels.items() if channel["constant"]] == ["v007"]


def test_alarms_the_switch_to_a_learned_model_raises_are_active_on_metrics(
    auto_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reading arrived before the fit finished: the replay through the learned model
    raises the shift's alarms, which no request raised; /metrics says they are open."""
    client = auto_client
    release, started = hold_the_fit(monkeypatch)
    client.put("/v1/streams/m", json={"learning": {"readings": 300}})
    values = 5 + np.random.default_rng(6).normal(0, 1, 600)
    values[400:] += 8  # a shift that lasts
    body = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    assert client.post("/v1/streams/m/readings", json={"readings": body[:300]}).status_code == 200
    assert started.wait(30)
    assert client.post("/v1/streams/m/readings", json={"readings": body[300:]}).status_code == 200
    release.set()
    wait_for(lambda: client.get("/v1/streams/m").json()["phase"] == "monitoring")
    wait_for(lambda: bool(client.get("/v1/streams/m").json().get("learned_model")))
    opened = {alarm["detector"] for alarm in client.get("/v1/streams/m").json()["open_alarms"]}
    assert opened
    exported = client.get("/metrics").text
    for detector in opened:
        assert f'twinwatch_alarm_active{{detector="{detector}",stream="m"}} 1.0' in exported


def test_a_rolling_rms_threshold_below_its_learned_rest_is_taken_and_closes_on_itself(
    make_client: AppFactory,
) -> None:
    """A learned rolling RMS rests somewhere below its threshold (its hysteresis starts there):
    a threshold asked below that rest, before the stream learned or after, is taken as asked,
    and the detector closes on its threshold, as an unlearned one does."""
    client = make_client(default_model="auto")
    lower = {"detectors": {"rolling_rms": {"threshold": 0.2}}}
    values = 5 + np.random.default_rng(7).normal(0, 1, 1300)
    rows = [{"t": START + i, "value": float(v)} for i, v in enumerate(values)]
    for stream, before_learning in (("early", True), ("late", False)):
        body: dict[str, Any] = {"learning": {"readings": 1100}}
        assert client.put(f"/v1/streams/{stream}", json=body | (lower if before_learning else {}))
        posted = client.post(f"/v1/streams/{stream}/readings", json={"readings": rows[:1100]})
        assert posted.status_code == 200
        wait_for(lambda s=stream: client.get(f"/v1/streams/{s}").json()["phase"] == "monitoring")
        learned = client.get(f"/v1/models/auto.{stream}").json()
        assert learned["versions"][0]["status"] == "active"
        if not before_learning:
            changed = client.put(f"/v1/streams/{stream}", json=lower)
            assert changed.status_code == 200, changed.text
        posted = client.post(f"/v1/streams/{stream}/readings", json={"readings": rows[1100:]})
        assert posted.status_code == 200, posted.text
        live = client.get(f"/v1/streams/{stream}").json()
        assert live["phase"] == "monitoring" and live["samples_seen"] == 1300
        assert live["live"]["detectors"]["rolling_rms"]["threshold"] == 0.2
