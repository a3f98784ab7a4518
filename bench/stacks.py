"""Where a request's time goes: py-spy's collapsed stacks sorted into the ingest path's stages.

py-spy (`record --idle --format raw`) samples every Python thread of the server at a fixed rate,
running or waiting, so a stage's samples times the sampling interval is the wall time threads
spent in it (waits on fsync or on the database included). A stack belongs to the first stage
whose pattern one of its frames contains; the order below goes from the most specific (commit,
checkpoint, readings insert) to the most general (the HTTP server), so a SQL statement issued by
the checkpoint counts as checkpoint, not as SQL. Stacks of threads waiting for work are idle.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# (stage, patterns): a stack is in the first stage one of whose patterns a frame contains;
# "A&B" needs a frame containing A and a frame containing B.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commit: COMMIT (fsync)", ("_commit_impl", "do_commit")),
    ("commit: flush pending UPDATEs", ("SessionTransaction._prepare_impl",)),
    ("readings insert + re-send check", ("app/storage/repositories/readings.py",)),
    ("alarm rows", ("app/storage/repositories/alarms.py",)),
    ("checkpoint: serialise + write", ("checkpoints.py", "StreamState.to_bytes")),
    ("stream row: advance", ("app/storage/repositories/streams.py",)),
    ("metrics", ("prometheus_client/", "app/metrics.py")),
    ("forecaster (ONNX Runtime)", ("app/forecasting/", "onnxruntime/")),
    ("detectors, alarm rules", ("app/monitoring/",)),
    ("recurrence bookkeeping", ("app/streams/recurrence.py", "app/streams/blocks.py")),
    (
        "live streams: hold, restore",
        ("app/streams/live.py", "app/streams/held.py", "app/streams/kinds.py"),
    ),
    ("session open/close, pool", ("sqlalchemy/", "app/storage/db.py")),
    ("ingest: checks, arrays", ("app/streams/ingest.py",)),
    ("answer: build ReadingsOut", ("_answer (app/api/readings.py",)),
    (
        "response: validate + serialise",
        ("serialize_response", "jsonable_encoder", "Response.render", "JSONResponse.render"),
    ),
    ("request: JSON parse", ("Request.json", "loads (json/")),
    (
        "request: pydantic validation",
        ("solve_dependencies", "request_body_to_args", "_validate_value_with_model_field"),
    ),
    ("handler + thread-pool hand-off", ("anyio/", "run_in_threadpool", "app/api/")),
    (
        "HTTP: uvicorn, httptools or h11, routing, middleware",
        ("uvicorn/", "h11/", "httptools/", "starlette/", "fastapi/"),
    ),
    ("asyncio event loop", ("asyncio/",)),
)
IDLE_LEAVES = (".select (selectors.py", "wait (threading.py", "get (queue.py")
REQUEST_FRAMES = (
    "app/api/",
    "app/streams/",
    "app/storage/",
    "fastapi/routing",
    "h11_impl.py",
    "httptools_impl.py",
)


def stage_of(frames: list[str]) -> str:
    """The stage of one sampled stack (root first)."""
    leaf = frames[-1] if frames else ""
    waiting = any(pattern in leaf for pattern in IDLE_LEAVES)
    if waiting and not any(marker in frame for frame in frames for marker in REQUEST_FRAMES):
        return "idle"  # the event loop or a pool thread waiting for work
    for stage, patterns in STAGES:
        for pattern in patterns:
            if all(any(part in frame for frame in frames) for part in pattern.split("&")):
                return stage
    return "other"


def summarise_profile(raw: str, *, requests: int, rate_hz: int = 1000) -> dict[str, Any]:
    """Samples per stage -> microseconds per request (idle excluded), busiest first."""
    samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples[stage_of(stack.split(";"))] += int(count)
    idle = samples.pop("idle", 0)
    per_request = {
        stage: 1e6 * count / rate_hz / requests for stage, count in samples.most_common()
    }
    return {
        "rate_hz": rate_hz,
        "requests": requests,
        "busy_samples": sum(samples.values()),
        "idle_samples": idle,
        "us_per_request": per_request,
    }
