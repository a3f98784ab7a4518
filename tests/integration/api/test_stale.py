"""A silent stream goes stale: a timer opens its `stale` alarm (no reading could) and exports
it to Prometheus; its next reading closes it."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from app.streams.stale import StaleWatch
from tests.integration.conftest import AppFactory

START = 1_700_000_000.0


def metric(client, name: str, stream: str) -> float | None:  # type: ignore[no-untyped-def]
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("stream") == stream:
                return float(sample.value)
    return None


def test_a_silent_stream_goes_stale_and_its_next_reading_closes_it(
    make_client: AppFactory,
) -> None:
    # 5 periods of 0.1 s, no shortest silence: half a second. Every per-stream series (the
    # silence too).
    client = make_client(stale_periods=5, stale_min_s=0, metrics_per_stream="all")
    client.put("/v1/streams/s", json={"model": "lstm-seed0", "sample_period_s": 0.1})
    rows = [{"t": START + 0.1 * i, "value": 0.0} for i in range(20)]
    assert client.post("/v1/streams/s/readings", json={"readings": rows}).status_code == 200
    assert metric(client, "twinwatch_stream_stale", "s") == 0.0
    deadline = time.monotonic() + 10
    while metric(client, "twinwatch_stream_stale", "s") != 1.0:
        assert time.monotonic() < deadline, "no stale alarm"
        time.sleep(0.1)
    (alarm,) = client.get("/v1/alarms", params={"stream": "s", "detector": "stale"}).json()["items"]
    assert alarm["state"] == "open" and alarm["opened_sample"] == 20
    assert alarm["threshold"] == 0.5 and alarm["peak"] > 0.5  # seconds of silence
    assert alarm["incident"] is not None
    assert (metric(client, "twinwatch_seconds_since_reading", "s") or 0) > 0.5
    assert metric(client, "twinwatch_alarms_total", "s") is not None

    late = [{"t": START + 100.0, "value": 0.0}]
    assert client.post("/v1/streams/s/readings", json={"readings": late}).status_code == 200
    (alarm,) = client.get("/v1/alarms", params={"stream": "s", "detector": "stale"}).json()["items"]
    assert alarm["state"] == "closed" and alarm["closed_sample"] == 20
    assert metric(client, "twinwatch_stream_stale", "s") == 0.0
    assert metric(client, "twinwatch_seconds_since_reading", "s") is not None
    incident = client.get(f"/v1/incidents/{alarm['incident']}").json()
    assert incident["state"] == "closed" and "stale" in incident["detectors"]


def test_by_default_only_a_stale_stream_has_a_stale_series(make_client: AppFactory) -> None:
    client = make_client(stale_periods=5, stale_min_s=0)
    client.put("/v1/streams/s", json={"model": "lstm-seed0", "sample_period_s": 0.1})
    rows = [{"t": START + 0.1 * i, "value": 0.0} for i in range(20)]
    assert client.post("/v1/streams/s/readings", json={"readings": rows}).status_code == 200
    assert metric(client, "twinwatch_stream_stale", "s") is None
    assert metric(client, "twinwatch_seconds_since_reading", "s") is None
    deadline = time.monotonic() + 10
    while metric(client, "twinwatch_stream_stale", "s") != 1.0:
        assert time.monotonic() < deadline, "no stale alarm"
        time.sleep(0.1)
    assert metric(client, "twinwatch_alarms_total", "s") == 1.0  # the stale alarm


def test_readings_waiting_for_a_bus_worker_lengthen_the_limit_by_their_wait(
    make_client: AppFactory,
) -> None:
    """A bus worker's backlog (`delay`: how long a stream's readings may have waited for it)
    is not the sensor's silence: a stream goes stale only once silent for its limit before
    the waiting began; one silent since before it does all the same."""
    client = make_client(stale_periods=0)  # no timer of its own: the test's watch checks
    state = client.app_state["twinwatch"]
    for stream in ("waiting", "silent"):
        client.put(f"/v1/streams/{stream}", json={"model": "lstm-seed0", "sample_period_s": 0.1})
        rows = [{"t": START + 0.1 * i, "value": 0.0} for i in range(20)]
        answer = client.post(f"/v1/streams/{stream}/readings", json={"readings": rows})
        assert answer.status_code == 200
    # 3 s after the last readings; the waiting stream's next readings have waited 2.8 s, the
    # silent one's partition has waited 2 s (its sensor stopped a second before that).
    delays = {"waiting": 2.8, "silent": 2.0}
    watch = StaleWatch(state.streams, state.metrics, periods=5, delay=delays.__getitem__)
    assert watch.check(now=time.monotonic() + 3.0) == ["silent"]
    delays["waiting"] = 0.0  # caught up, and nothing came: silent all along
    assert watch.check(now=time.monotonic() + 3.0) == ["waiting"]


def test_a_gateway_that_uploads_every_two_seconds_is_not_stale(make_client: AppFactory) -> None:
    """The defaults (10 periods, at least 30 s): a 10 Hz stream uploaded 20 readings at a time
    every 2 s for 5 minutes, its silences judged as the timer would judge them, raises nothing;
    silent for 31 s, it is stale; the stream says its limit."""
    client = make_client(stale_periods=0)  # the test's watch checks, on its own clock
    state = client.app_state["twinwatch"]
    watch = StaleWatch(state.streams, state.metrics, periods=10, min_s=30)
    client.put("/v1/streams/g", json={"model": "lstm-seed0", "sample_period_s": 0.1})
    for upload in range(150):
        rows = [{"t": START + 0.1 * (20 * upload + i), "value": 0.0} for i in range(20)]
        assert client.post("/v1/streams/g/readings", json={"readings": rows}).status_code == 200
        assert watch.check(now=time.monotonic() + 2.0) == []
    assert client.get("/v1/alarms", params={"stream": "g"}).json()["items"] == []
    assert watch.check(now=time.monotonic() + 31.0) == ["g"]
    default = make_client(stale_periods=10, stale_min_s=30)
    default.put("/v1/streams/d", json={"model": "lstm-seed0", "sample_period_s": 0.1})
    assert default.get("/v1/streams/d").json()["stale_after_s"] == 30
    default.put("/v1/streams/slow", json={"model": "lstm-seed0", "sample_period_s": 60})
    assert default.get("/v1/streams/slow").json()["stale_after_s"] == 600


def test_a_stale_alarm_never_closes_before_it_opened(make_client: AppFactory) -> None:
    """Readings that were late, not missing (on their own clock no gap): the stale alarm the
    wait raised closes where it opened, never before."""
    client = make_client(stale_periods=0)
    state = client.app_state["twinwatch"]
    watch = StaleWatch(state.streams, state.metrics, periods=5, min_s=0)
    client.put("/v1/streams/late", json={"model": "lstm-seed0", "sample_period_s": 0.1})
    rows = [{"t": START + 0.1 * i, "value": 0.0} for i in range(20)]
    assert client.post("/v1/streams/late/readings", json={"readings": rows}).status_code == 200
    assert watch.check(now=time.monotonic() + 3.0) == ["late"]
    (opened,) = client.get("/v1/alarms", params={"stream": "late"}).json()["items"]
    assert opened["opened_at"].startswith("2023-11-14T22:13:22.4")  # the last (21.9) + 0.5 s
    next_one = [{"t": START + 2.0, "value": 0.0}]  # 0.1 s after the last: no gap on its clock
    assert client.post("/v1/streams/late/readings", json={"readings": next_one}).status_code == 200
    (alarm,) = client.get("/v1/alarms", params={"stream": "late"}).json()["items"]
    assert alarm["state"] == "closed" and alarm["closed_at"] == alarm["opened_at"]
    incident = client.get(f"/v1/incidents/{alarm['incident']}").json()
    assert incident["closed_at"] == incident["opened_at"]
