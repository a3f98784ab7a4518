"""The twin's HTTP client: retries, hard errors, pacing and stopping, against a mock service."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pytest

from app.errors import AppError, ConflictError, UnauthorizedError
from app.twin.client import (
    Batch,
    Retry,
    ServiceClient,
    ServiceError,
    run_twin,
    stream_config,
    with_retries,
)
from app.twin.schedule import Scenario, Timeline

NOW = datetime(2026, 1, 1, tzinfo=UTC)
Handler = Callable[[httpx.Request], httpx.Response]


class FakeClock:
    """Monotonic time that only moves when the code under test waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += max(0.0, seconds)
        return False


class FakeService:
    """Stores readings like the service: re-sent ones are duplicates, older new ones 409."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[str, Any]] = {}
        self.readings: list[dict[str, Any]] = []
        self.posts: list[int] = []
        self.failures: list[httpx.Response | Exception] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        stream_id = request.url.path.split("/")[3]
        if request.method == "GET":
            if stream_id not in self.streams:
                return httpx.Response(404, json={"detail": "no such stream"})
            return httpx.Response(200, json=self.streams[stream_id])
        if request.method == "PUT":
            body = json.loads(request.content)
            self.streams[stream_id] = {"id": stream_id, "model": "m", "last_t": None, **body}
            return httpx.Response(201, json=self.streams[stream_id])
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return failure
        batch = json.loads(request.content)["readings"]
        self.posts.append(len(batch))
        known = {r["t"] for r in self.readings}
        fresh = [r for r in batch if r["t"] not in known]
        self.readings.extend(fresh)
        return httpx.Response(
            200,
            json={
                "accepted": len(fresh),
                "duplicates": len(batch) - len(fresh),
                "results": [],
                "opened": [],
                "closed": [],
            },
        )


def scenario(n: int, start: int = 100) -> Scenario:
    values = np.arange(n, dtype=np.float64)
    return Scenario(start, values, values + 0.5, faults=(), seed=0)


def client_for(service: Handler, token: str | None = None) -> ServiceClient:
    http = httpx.Client(transport=httpx.MockTransport(service))
    return ServiceClient("http://twinwatch.test", token=token, http=http)


def run(
    service: FakeService,
    n: int = 50,
    *,
    speed: float = 1.0,
    stop: threading.Event | None = None,
    clock: FakeClock | None = None,
    **kwargs: Any,
) -> Any:
    clock = clock or FakeClock()
    return run_twin(
        client_for(service),
        "pump-1",
        scenario(n),
        Timeline(samples=n, rate_hz=10.0, speed=speed),
        stop=stop or threading.Event(),
        clock=clock,
        now_utc=lambda: NOW,
        wait=clock.wait,
        **kwargs,
    )


def test_registers_the_stream_with_a_reference_and_sends_every_reading_once_in_real_time() -> None:
    service = FakeService()
    clock = FakeClock()
    report = run(service, 50, clock=clock)
    assert service.streams["pump-1"]["has_reference"] is True
    assert service.streams["pump-1"]["sample_period_s"] == pytest.approx(0.1)
    assert report.sent == report.accepted == 50 and report.duplicates == 0
    assert service.posts == [1] * 50  # never behind: one reading per request
    assert clock.now - 1000.0 == pytest.approx(4.9)  # 50 readings at 10 Hz
    first, last = service.readings[0], service.readings[-1]
    assert first == {"t": NOW.isoformat(), "value": 0.0, "reference": 0.5}
    assert datetime.fromisoformat(last["t"]) == datetime(2026, 1, 1, 0, 0, 4, 900000, tzinfo=UTC)


def test_speed_keeps_the_timestamps_and_shortens_the_run() -> None:
    service = FakeService()
    clock = FakeClock()
    run(service, 50, speed=10.0, clock=clock)
    assert clock.now - 1000.0 == pytest.approx(0.49)
    assert datetime.fromisoformat(service.readings[-1]["t"]) - NOW == (
        datetime(2026, 1, 1, 0, 0, 4, 900000, tzinfo=UTC) - NOW
    )


def test_a_slow_service_gets_batches() -> None:
    service = FakeService()
    clock = FakeClock()

    def slow_post(batch: Batch) -> None:
        clock.now += 1.0  # each request takes a second: 10 readings fall due meanwhile

    report = run(service, 50, clock=clock, on_batch=slow_post, max_batch=8)
    assert report.sent == 50 and len(service.readings) == 50
    assert max(service.posts) == 8  # capped by max_batch
    assert len(service.posts) < 50 and report.max_lag_s > 0.5


def test_network_errors_and_5xx_are_retried_with_backoff_and_resent_safely() -> None:
    service = FakeService()
    service.failures = [
        httpx.ConnectError("refused"),
        httpx.Response(503, json={"detail": "database unavailable"}),
        httpx.ReadTimeout("slow"),
    ]
    clock = FakeClock()
    retries: list[tuple[int, float]] = []
    report = run(
        service,
        5,
        clock=clock,
        retry=Retry(attempts=5, first_s=0.5, max_delay_s=10.0),
        on_retry=lambda attempt, delay, reason: retries.append((attempt, delay)),
    )
    assert retries == [(1, 0.5), (2, 1.0), (3, 2.0)]
    assert report.retries == 3 and report.sent == 5 and len(service.readings) == 5


def test_backoff_is_bounded_and_gives_up_with_a_clear_error() -> None:
    assert Retry(attempts=8, first_s=0.5, max_delay_s=4.0).delays() == [
        0.5,
        1.0,
        2.0,
        4.0,
        4.0,
        4.0,
        4.0,
    ]
    service = FakeService()
    service.failures = [httpx.Response(500, text="boom")] * 10
    with pytest.raises(ServiceError, match=r"failed 3 times, last with HTTP 500: boom"):
        run(service, 5, retry=Retry(attempts=3))


def test_a_resent_batch_whose_answer_was_lost_counts_as_duplicates() -> None:
    service = FakeService()
    calls = 0

    def lossy(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        response = service(request)
        if request.method == "POST":
            calls += 1
            if calls == 2:  # stored, but the answer never arrives
                raise httpx.RemoteProtocolError("connection reset")
        return response

    clock = FakeClock()
    report = run_twin(
        client_for(lossy),
        "pump-1",
        scenario(3),
        Timeline(samples=3, rate_hz=10.0),
        stop=threading.Event(),
        clock=clock,
        now_utc=lambda: NOW,
        wait=clock.wait,
    )
    assert len(service.readings) == 3
    assert report.duplicates == 1 and report.accepted == 2 and report.retries == 1


def test_409_is_a_hard_error_and_never_retried() -> None:
    service = FakeService()
    service.failures = [
        httpx.Response(409, json={"detail": "readings[0].t is older than the last reading"})
    ]
    with pytest.raises(ConflictError, match=r"refused the readings \(409\).*older.*--stream"):
        run(service, 5)
    assert service.failures == []  # one attempt only


def test_401_names_the_token_option() -> None:
    service = FakeService()
    service.failures = [httpx.Response(401, json={"detail": "missing bearer token"})]
    with pytest.raises(UnauthorizedError, match="--token or set TWINWATCH_API_TOKEN"):
        run(service, 5)


def test_the_token_is_sent_as_a_bearer_header() -> None:
    service = FakeService()
    with client_for(service, token="s3cret-token-1234") as client:
        client.get_stream("pump-1")
    assert service.headers[-1]["authorization"] == "Bearer s3cret-token-1234"


def test_other_client_errors_carry_the_services_detail() -> None:
    service = FakeService()
    service.failures = [httpx.Response(422, json={"detail": "readings.0.value: not finite"})]
    with pytest.raises(AppError, match=r"failed \(422\): readings\.0\.value: not finite"):
        run(service, 5)


def test_stop_finishes_the_batch_in_flight_then_returns() -> None:
    service = FakeService()
    stop = threading.Event()

    def stop_after_third(batch: Batch) -> None:
        if batch.first == 2:
            stop.set()

    report = run(service, 50, stop=stop, on_batch=stop_after_third)
    assert report.stopped and report.sent == 3
    assert len(service.readings) == 3


def test_stop_during_a_retry_still_delivers_the_batch_in_flight() -> None:
    service = FakeService()
    service.failures = [httpx.ConnectError("refused")]
    stop = threading.Event()
    clock = FakeClock()

    def wait_and_signal(seconds: float) -> bool:
        stop.set()  # SIGTERM arrives while the twin waits to retry
        return clock.wait(seconds)

    report = run_twin(
        client_for(service),
        "pump-1",
        scenario(10),
        Timeline(samples=10, rate_hz=10.0),
        stop=stop,
        clock=clock,
        now_utc=lambda: NOW,
        wait=wait_and_signal,
    )
    assert report.stopped and report.sent == 1 and len(service.readings) == 1


def test_an_existing_stream_is_continued_after_its_last_reading() -> None:
    service = FakeService()
    later = "2026-01-01T00:10:00+00:00"
    service.streams["pump-1"] = {"id": "pump-1", "model": "m", "has_reference": True}
    service.streams["pump-1"]["last_t"] = later
    report = run(service, 3)
    assert report.t0 is not None and report.t0 > datetime.fromisoformat(later)
    assert datetime.fromisoformat(service.readings[0]["t"]) == report.t0


def test_an_existing_stream_without_a_reference_is_refused() -> None:
    service = FakeService()
    service.streams["pump-1"] = {"id": "pump-1", "model": "m", "has_reference": False}
    with pytest.raises(ConflictError, match="without has_reference"):
        run(service, 3)


def test_missing_readings_are_sent_as_null() -> None:
    service = FakeService()
    clock = FakeClock()
    values = np.array([1.0, np.nan, 3.0])
    run_twin(
        client_for(service),
        "pump-1",
        Scenario(0, values, values, faults=(), seed=0),
        Timeline(samples=3, rate_hz=10.0),
        stop=threading.Event(),
        clock=clock,
        now_utc=lambda: NOW,
        wait=clock.wait,
    )
    assert [r["value"] for r in service.readings] == [1.0, None, 3.0]


def test_with_retries_reports_a_stop_request_while_waiting() -> None:
    from app.twin.client import StopRequestedError, TransientError

    def failing() -> int:
        raise TransientError("HTTP 503")

    with pytest.raises(StopRequestedError):
        with_retries(failing, Retry(attempts=3), lambda seconds: True, what="POST")


def test_stream_config_names_the_model_only_when_given() -> None:
    assert "model" not in stream_config(10.0, None)
    assert stream_config(20.0, "lstm-seed0") == {
        "sample_period_s": 0.05,
        "has_reference": True,
        "model": "lstm-seed0",
    }
