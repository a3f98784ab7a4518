"""A restart answers at once: the streams are restored behind the open port, and a request for
a stream not restored yet restores that stream first. Its results are those of a stream that was
restored before it was asked for, to the last bit, and readiness says how far the restore is."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.streams import live as live_module
from app.streams.live import LiveStreams
from tests.integration.conftest import AppFactory

T0 = 1_767_225_600.0
STREAMS = [f"s{i}" for i in range(8)]


def readings(first: int, stop: int) -> list[dict[str, Any]]:
    values = np.sin(np.arange(stop) / 5.0) + np.random.default_rng(3).normal(0, 0.1, stop)
    return [{"t": T0 + 0.1 * i, "value": float(values[i])} for i in range(first, stop)]


def post(client: TestClient, stream: str, first: int, stop: int) -> list[dict[str, Any]]:
    answer = client.post(f"/v1/streams/{stream}/readings", json={"readings": readings(first, stop)})
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


def test_a_stream_asked_for_during_the_restore_is_restored_first_and_exactly(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client(checkpoint_every=37)  # a restore replays the readings after one
    for stream in STREAMS:
        assert client.put(f"/v1/streams/{stream}", json={}).status_code == 201
        post(client, stream, 0, 150)
    client.__exit__(None, None, None)  # a graceful stop: every stream checkpointed ...
    # ... and more readings stored after the checkpoints, as after a crash, through a server
    # that is killed before its stop can checkpoint them.
    crashed = make_client(checkpoint_every=37)
    for stream in STREAMS:
        post(crashed, stream, 150, 200)
    monkeypatch.setattr(LiveStreams, "checkpoint_all", lambda self: 0)
    crashed.__exit__(None, None, None)
    monkeypatch.undo()

    # The restore in the background, a stream at a time, each slowly: the first request comes
    # while the last stream is still far from its turn.
    monkeypatch.setattr(live_module, "RESTORED_TOGETHER", 1)
    original = LiveStreams.restore
    release = threading.Event()

    def slow(self: LiveStreams, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "twinwatch-restore":
            release.wait(10)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LiveStreams, "restore", slow)
    again = make_client(checkpoint_every=37, restored=False)
    ready = again.get("/readyz")
    assert ready.status_code == 200 and "restoring" in ready.json()["checks"]["streams"]
    asked = post(again, STREAMS[-1], 200, 260)  # restored by the request itself
    assert again.get("/readyz").json()["checks"]["streams"].startswith("restoring: ")
    release.set()
    deadline = time.monotonic() + 30
    while again.get("/readyz").json()["checks"]["streams"].startswith("restoring"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert again.get("/readyz").json()["checks"]["streams"] == f"{len(STREAMS)} restored"
    behind = post(again, STREAMS[0], 200, 260)  # restored by the restore
    assert asked == behind  # (the same readings from the same state: the same bits)
