"""No alarm closes before it opens, whatever raised it: the lab record's four faults, a gap of
missing readings and a silence, through a trained model and through a stream that learned its
own (point, shift, rolling RMS, frozen, level, missing), then the stale timer and a reading
that was late rather than missing; every alarm row and incident is checked."""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient

from app.streams.stale import StaleWatch
from tests.integration.conftest import AppFactory
from tests.support.models import epoch_times, lab_series

LEARNING = 4000


def rows(first: int, stop: int) -> list[dict[str, Any]]:
    series = lab_series()
    times = epoch_times(first, stop)
    out = []
    for i, t in zip(range(first, stop), times, strict=True):
        value = None if 7600 <= i < 7610 else float(series.value[i])  # a gap of ten
        reference = float(series.columns["reference"][i])
        out.append({"t": float(t), "value": value, "reference": reference})
    return out


def post(client: TestClient, stream: str, first: int, stop: int) -> None:
    for start in range(first, stop, 2000):
        body = {"readings": rows(start, min(stop, start + 2000))}
        answer = client.post(f"/v1/streams/{stream}/readings?results=false", json=body)
        assert answer.status_code == 200, answer.text


def every(client: TestClient, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = client.get(path, params=params).json()
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_no_alarm_of_any_kind_closes_before_it_opens(make_client: AppFactory) -> None:
    client = make_client(stale_periods=0)
    client.put("/v1/streams/trained", json={"model": "lstm-seed0", "has_reference": True})
    client.put(
        "/v1/streams/learned",
        json={"model": "auto", "has_reference": True, "learning": {"readings": LEARNING}},
    )
    post(client, "trained", 0, 8000)
    post(client, "learned", 0, LEARNING)
    deadline = time.monotonic() + 60
    while not client.get("/v1/streams/learned").json().get("learned_model"):
        assert time.monotonic() < deadline, "the stream did not learn"
        time.sleep(0.05)
    post(client, "learned", LEARNING, 8000)
    state = client.app_state["twinwatch"]
    watch = StaleWatch(state.streams, state.metrics, periods=10, min_s=0)
    assert sorted(watch.check(now=time.monotonic() + 60)) == ["learned", "trained"]
    late = {"readings": [{"t": float(epoch_times(8000, 8001)[0]), "value": 0.0, "reference": 0.0}]}
    for stream in ("trained", "learned"):
        assert client.post(f"/v1/streams/{stream}/readings", json=late).status_code == 200

    alarms = every(client, "/v1/alarms")
    kinds = {(alarm["stream"], alarm["detector"]) for alarm in alarms}
    assert {"point", "rolling_rms", "stale"} <= {
        detector for stream, detector in kinds if stream == "trained"
    }, kinds
    assert {"point", "shift", "rolling_rms", "frozen", "level", "missing", "stale"} <= {
        detector for stream, detector in kinds if stream == "learned"
    }, kinds
    for alarm in alarms:
        if alarm["closed_at"] is not None:
            assert at(alarm["closed_at"]) >= at(alarm["opened_at"]), alarm
            assert alarm["closed_sample"] >= alarm["opened_sample"], alarm
    incidents = every(client, "/v1/incidents")
    assert incidents and all(
        at(i["closed_at"]) >= at(i["opened_at"]) for i in incidents if i["closed_at"]
    )
    assert not any(math.isnan(alarm["peak"]) for alarm in alarms)
