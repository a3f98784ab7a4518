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
    # 5 periods of 0.1 s: half a second of silence. Every per-stream series (the silence too).
    client = make_client(stale_periods=5, metrics_per_stream="all")
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
    client = make_client(stale_periods=5)
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
