"""The twin as a client of the service: register a stream, then post its readings on time.

Three layers: `ServiceClient` speaks HTTP (one call, one answer, problem JSON turned into
`AppError`s), `Retry` decides what to retry and how long to wait, and `run_twin` paces the
scenario against an injected clock. Re-sending a batch is safe because the service counts re-sent
readings as duplicates, so every network error and 5xx is retried with bounded exponential
back-off; a 409 means the stream holds other readings at those times and is never retried.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from types import FrameType
from typing import Any, TypeVar

import httpx

from app.errors import AppError, ConflictError, NotFoundError, UnauthorizedError
from app.twin.schedule import Scenario, Timeline, resume_origin

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_MAX_BATCH = 1000

T = TypeVar("T")


class ServiceError(AppError):
    """The service could not be reached, or kept failing, within the retry budget."""

    status = 503
    title = "Service unavailable"
    type_slug = "service-unavailable"


class TransientError(Exception):
    """A failure worth retrying: the network, a timeout, a 5xx or a 429."""


class StopRequestedError(Exception):
    """Asked to stop while waiting to retry; the batch in flight was not confirmed."""


def _problem_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    return str(body)[:300]


class ServiceClient:
    """The few endpoints the twin needs. `http` lets tests pass a TestClient or a mock."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._own = http is None
        self.http = http if http is not None else httpx.Client(timeout=timeout_s)
        self.headers = headers

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            response = self.http.request(
                method, f"{self.url}{path}", json=body, headers=self.headers
            )
        except httpx.TransportError as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise TransientError(f"HTTP {status}: {_problem_detail(response)}")
        if status == 401:
            raise UnauthorizedError(
                f"{self.url} refused the token (401): pass --token or set TWINWATCH_API_TOKEN "
                f"to the service's token ({_problem_detail(response)})"
            )
        if status == 404:
            raise NotFoundError(f"{method} {path}: {_problem_detail(response)}")
        if status == 409:
            raise ConflictError(
                f"the service refused the readings (409): {_problem_detail(response)}. The "
                "stream holds other readings at these times; use another --stream or delete it"
            )
        if status >= 400:
            raise AppError(f"{method} {path} failed ({status}): {_problem_detail(response)}")
        return response

    def get_stream(self, stream_id: str) -> dict[str, Any] | None:
        try:
            answer: dict[str, Any] = self._call("GET", f"/v1/streams/{stream_id}").json()
        except NotFoundError:
            return None
        return answer

    def put_stream(self, stream_id: str, config: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("PUT", f"/v1/streams/{stream_id}", config).json()
        return answer

    def post_readings(self, stream_id: str, readings: list[dict[str, Any]]) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(
            "POST", f"/v1/streams/{stream_id}/readings", {"readings": readings}
        ).json()
        return answer

    def models(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call("GET", "/v1/models").json()["items"]
        return items

    def delete_stream(self, stream_id: str) -> None:
        self._call("DELETE", f"/v1/streams/{stream_id}")

    def alarms(self, stream_id: str) -> list[dict[str, Any]]:
        """Every alarm of the stream, page after page."""
        return self._pages("alarms", stream_id)

    def incidents(self, stream_id: str) -> list[dict[str, Any]]:
        """Every incident of the stream, page after page."""
        return self._pages("incidents", stream_id)

    def _pages(self, what: str, stream_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = f"?stream={stream_id}&limit=1000" + (f"&cursor={cursor}" if cursor else "")
            page = self._call("GET", f"/v1/{what}{query}").json()
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items


@dataclass(frozen=True)
class Retry:
    """Exponential back-off: `first_s`, doubling, capped at `max_delay_s`; `attempts` in all."""

    attempts: int = 8
    first_s: float = 0.5
    max_delay_s: float = 10.0

    def delays(self) -> list[float]:
        """Waits before the 2nd, 3rd, ... attempt (7 waits, 35.5 s in all, by default)."""
        return [min(self.max_delay_s, self.first_s * 2**i) for i in range(self.attempts - 1)]


Wait = Callable[[float], bool]
"""Sleep up to the given seconds; True if the sleep was cut short by a request to stop."""


def with_retries(
    call: Callable[[], T],
    retry: Retry,
    wait: Wait,
    *,
    what: str,
    on_retry: Callable[[int, float, str], None] | None = None,
) -> T:
    """`call()`, retried on `TransientError` after each of `retry.delays()`."""
    delays = retry.delays()
    for attempt in range(retry.attempts):
        try:
            return call()
        except TransientError as exc:
            if attempt == len(delays):
                raise ServiceError(
                    f"{what} failed {retry.attempts} times, last with {exc}; giving up"
                ) from None
            if on_retry is not None:
                on_retry(attempt + 1, delays[attempt], str(exc))
            if wait(delays[attempt]):
                raise StopRequestedError(what) from None
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class Batch:
    """One answered POST: which readings it carried and what the service said."""

    first: int  # reading number g of the first reading
    samples: list[int]  # scenario sample index of each reading
    times: list[datetime]
    answer: dict[str, Any]
    lag_s: float  # how late the batch's first reading left, against its due time


@dataclass
class TwinReport:
    stream: str
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    batches: int = 0
    retries: int = 0
    opened: list[dict[str, Any]] = field(default_factory=list)
    closed: list[dict[str, Any]] = field(default_factory=list)
    max_lag_s: float = 0.0
    elapsed_s: float = 0.0
    stopped: bool = False  # asked to stop before the end
    t0: datetime | None = None


def stream_config(
    scenario_rate_hz: float, model: str | None, detectors: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The PUT body of the twin's stream: one channel with the healthy sensor as reference."""
    body: dict[str, Any] = {"sample_period_s": 1.0 / scenario_rate_hz, "has_reference": True}
    if model is not None:
        body["model"] = model
    if detectors:
        body["detectors"] = detectors
    return body


def register(
    client: ServiceClient,
    stream_id: str,
    *,
    rate_hz: float,
    model: str | None,
    retry: Retry,
    wait: Wait,
) -> dict[str, Any]:
    """Create the stream if it is new; an existing one keeps its configuration (and overrides)."""
    existing = with_retries(
        lambda: client.get_stream(stream_id), retry, wait, what=f"GET stream {stream_id}"
    )
    if existing is not None:
        if not existing.get("has_reference", False):
            raise ConflictError(
                f"stream {stream_id!r} exists without has_reference; the twin sends a "
                "reference with every reading: use another --stream or delete it"
            )
        if model is not None and existing.get("model") != model:
            raise ConflictError(
                f"stream {stream_id!r} exists with model {existing.get('model')!r}, not {model!r}"
            )
        return existing
    return with_retries(
        lambda: client.put_stream(stream_id, stream_config(rate_hz, model)),
        retry,
        wait,
        what=f"PUT stream {stream_id}",
    )


def _number(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def readings_of(
    scenario: Scenario, timeline: Timeline, numbers: range, t0: datetime
) -> list[dict[str, Any]]:
    """The JSON readings for reading numbers `numbers` (RFC 3339 times, null when missing)."""
    out = []
    for g in numbers:
        k = timeline.offset(g)
        out.append(
            {
                "t": timeline.timestamp(g, t0).isoformat(),
                "value": _number(float(scenario.values[k])),
                "reference": _number(float(scenario.references[k])),
            }
        )
    return out


def run_twin(
    client: ServiceClient,
    stream_id: str,
    scenario: Scenario,
    timeline: Timeline,
    *,
    stop: threading.Event,
    abort: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    now_utc: Callable[[], datetime] = lambda: datetime.now(UTC),
    wait: Wait | None = None,
    retry: Retry | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    model: str | None = None,
    on_batch: Callable[[Batch], None] | None = None,
    on_retry: Callable[[int, float, str], None] | None = None,
) -> TwinReport:
    """Register the stream and send the scenario on its timeline until done or `stop` is set.

    The batch in flight when `stop` is set is finished (retried if need be), so what the service
    holds ends on a batch boundary. `abort` (a second signal) cuts a retry wait short.
    """
    retry = retry or Retry()
    abort = abort or threading.Event()
    if max_batch < 1:
        raise AppError(f"--max-batch must be at least 1, got {max_batch}")

    def stop_wait(seconds: float) -> bool:
        return stop.wait(max(0.0, seconds))

    def abort_wait(seconds: float) -> bool:
        return abort.wait(max(0.0, seconds))

    pace_wait = wait or stop_wait
    retry_wait = wait or abort_wait

    stream = register(
        client, stream_id, rate_hz=timeline.rate_hz, model=model, retry=retry, wait=abort_wait
    )
    last_t = stream.get("last_t")
    t0 = resume_origin(
        now_utc(), None if last_t is None else datetime.fromisoformat(last_t), timeline.rate_hz
    )
    report = TwinReport(stream=stream_id, t0=t0)
    started = clock()
    sent = 0

    def counted_retry(attempt: int, delay: float, reason: str) -> None:
        report.retries += 1
        if on_retry is not None:
            on_retry(attempt, delay, reason)

    while timeline.total is None or sent < timeline.total:
        if stop.is_set():
            report.stopped = True
            break
        now = clock()
        numbers = timeline.next_batch(sent, now, started, max_batch)
        if not numbers:
            if pace_wait(timeline.due(sent, started) - now):
                report.stopped = True
                break
            continue
        readings = readings_of(scenario, timeline, numbers, t0)
        lag = now - timeline.due(numbers.start, started)
        try:
            answer = with_retries(
                partial(client.post_readings, stream_id, readings),
                retry,
                retry_wait,
                what=f"POST {len(readings)} readings to {stream_id}",
                on_retry=counted_retry,
            )
        except StopRequestedError:
            report.stopped = True
            break
        sent = numbers.stop
        report.sent += len(readings)
        report.accepted += int(answer.get("accepted", 0))
        report.duplicates += int(answer.get("duplicates", 0))
        report.opened.extend(answer.get("opened", []))
        report.closed.extend(answer.get("closed", []))
        report.batches += 1
        report.max_lag_s = max(report.max_lag_s, lag)
        if on_batch is not None:
            on_batch(
                Batch(
                    first=numbers.start,
                    samples=[scenario.start + timeline.offset(g) for g in numbers],
                    times=[timeline.timestamp(g, t0) for g in numbers],
                    answer=answer,
                    lag_s=lag,
                )
            )
    report.elapsed_s = clock() - started
    return report


@contextmanager
def stop_on_signals(stop: threading.Event, abort: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set `stop` (finish the batch in flight); a second one also sets `abort`.

    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            abort.set()
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
