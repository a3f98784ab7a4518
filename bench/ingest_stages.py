"""Where one ingest request's time goes, stage by stage, without HTTP in the way.

Builds the service's state exactly as the app's lifespan does (`app.main.open_state`: real
database, the stateful LSTM calibrated as bench/ingest.py calibrates it, or with `--model-kind
lstm` the window LSTM) and runs what `POST .../readings` runs: the body validated from its bytes
(as `app.api.bodies.json_body` does), `StreamEngine.ingest` (lock, forecast, detectors,
readings insert, alarm rows, checkpoint, commit), building the answer and serialising it. Each
stage's function is wrapped with a timer; times are exclusive per thread (a stage's time
excludes the stages it calls). Everything runs in the request's thread except a long batch's
checks, which run in a helper thread beside its forecasts (`StreamEngine._checked`): that row is
the helper's time, so the rows add up to more than the request's wall time by about it. The HTTP
server's own share is the parse-only ceiling of bench/ingest.py minus the first row here.

    python bench/ingest_stages.py                       # SQLite, batches of 1, 100 and 1,000
    python bench/ingest_stages.py --database postgresql
    python bench/ingest_stages.py --model-kind lstm     # the window LSTM
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import (
    DEFAULT_MODEL,
    DEFAULT_POSTGRES,
    calibrated_models,
    postgres_schema,
    readings_body,
    stateful_model,
)
from ingest import STATEFUL_WARMUP_EXTRA, WARMUP_READINGS, series_values
from pydantic_core import to_json
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.orm import SessionTransaction

from app.api import readings as readings_api
from app.forecasting.base import Forecaster
from app.forecasting.stateful_lstm import STATEFUL_WINDOW, StatefulLSTMForecaster
from app.forecasting.training import use_one_thread
from app.main import open_state
from app.metrics import Metrics
from app.monitoring.monitor import Monitor
from app.registry import default_loader
from app.schemas import ReadingsIn
from app.settings import Settings
from app.storage.repositories import checkpoints, readings, streams
from app.streams.engine import StreamEngine
from app.streams.processor import StreamProcessor, StreamState

BATCHES = (1, 100, 1000)
REQUESTS = {1: 400, 100: 100, 1000: 20}


class StageTimer:
    """Exclusive wall and CPU time per stage: a stage's clocks stop while a nested stage runs
    in the same thread.

    Wall time includes waiting (fsync, the database server, other processes on the CPU); CPU
    time is the thread's own work, the steadier figure on a shared machine."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._threads = threading.local()
        self._lock = threading.Lock()

    @property
    def _stack(self) -> list[list[Any]]:
        """This thread's open stages: [stage, wall at start, cpu at start, children]."""
        stack: list[list[Any]] | None = getattr(self._threads, "stack", None)
        if stack is None:
            stack = self._threads.stack = []
        return stack

    def clear(self) -> None:
        self.wall.clear()
        self.cpu.clear()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        frame: list[Any] = [name, time.perf_counter(), time.thread_time(), 0.0, 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            wall = time.perf_counter() - frame[1]
            cpu = time.thread_time() - frame[2]
            with self._lock:
                self.wall[name] += wall - frame[3]
                self.cpu[name] += cpu - frame[4]
            if self._stack:
                self._stack[-1][3] += wall
                self._stack[-1][4] += cpu

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def instrument(timer: StageTimer) -> None:
    """Wrap the functions of the ingest path (module attributes and methods, as they are
    looked up at call time)."""
    timer.wrap(StreamEngine, "ingest", "engine: session, lock, the rest")
    timer.wrap(StreamEngine, "live", "engine: live state lookup")
    timer.wrap(StreamEngine, "_values", "engine: readings to arrays")
    timer.wrap(StreamEngine, "_checked", "engine: batch checks (helper thread if long)")
    timer.wrap(StreamEngine, "_check_resent", "engine: re-send check")
    timer.wrap(StreamProcessor, "advance_many", "processor: window bookkeeping")
    timer.wrap(Forecaster, "predict", "forecaster (LSTM)")
    timer.wrap(StatefulLSTMForecaster, "run", "forecaster (LSTM)")
    timer.wrap(StatefulLSTMForecaster, "step", "forecaster (LSTM)")
    timer.wrap(Monitor, "run", "detectors: run")
    timer.wrap(Monitor, "open_events", "detectors: run")
    timer.wrap(readings, "insert_batches", "readings: insert")
    timer.wrap(StreamEngine, "_store_alarms", "alarm rows: select open, write")
    timer.wrap(StreamState, "to_bytes", "checkpoint: state to JSON")
    timer.wrap(checkpoints, "save", "checkpoint: write")
    timer.wrap(streams, "advance", "stream row: advance")
    timer.wrap(SessionTransaction, "commit", "commit: final flush, ORM")
    timer.wrap(DefaultDialect, "do_commit", "commit: COMMIT (fsync)")
    timer.wrap(StreamEngine, "_publish", "metrics")


ORDER = (
    "request: parse and validate the body",
    "engine: live state lookup",
    "engine: readings to arrays",
    "engine: batch checks (helper thread if long)",
    "engine: re-send check",
    "forecaster (LSTM)",
    "detectors: run",
    "processor: window bookkeeping",
    "readings: insert",
    "alarm rows: select open, write",
    "checkpoint: state to JSON",
    "checkpoint: write",
    "stream row: advance",
    "commit: final flush, ORM",
    "commit: COMMIT (fsync)",
    "metrics",
    "engine: session, lock, the rest",
    "answer: build ReadingsOut",
    "response: serialise",
)


def run(
    timer: StageTimer, database_url: str, work: Path, requests_scale: float, model_kind: str
) -> dict[int, dict[str, float]]:
    if model_kind == "lstm-stateful":
        model, _ = stateful_model(work / "models")
        models, warmup = work / "models", STATEFUL_WINDOW + STATEFUL_WARMUP_EXTRA
    else:
        models, model, warmup = calibrated_models(work), DEFAULT_MODEL, WARMUP_READINGS
    settings = Settings(
        database_url=database_url,
        models_dir=models,
        default_model=model,
        data_dir=work / "data",
    )
    state = open_state(settings, Metrics(), default_loader)
    most = max(batch * max(1, int(REQUESTS[batch] * requests_scale)) for batch in BATCHES)
    values = series_values(warmup + most)
    results: dict[int, dict[str, float]] = {}
    try:
        for batch in BATCHES:
            count = max(1, int(REQUESTS[batch] * requests_scale))
            stream = f"stages-b{batch}"
            with state.database.session() as session:
                streams.create(
                    session,
                    stream_id=stream,
                    model_name=settings.default_model,
                    channels=["value"],
                    sample_period_s=0.1,
                    has_reference=False,
                    detector_overrides={},
                    now=datetime.now(UTC),
                )
            warm = ReadingsIn.model_validate_json(readings_body(values[:warmup], 0))
            state.engine.ingest(stream, warm.readings)
            bodies = [
                readings_body(
                    values[warmup + k * batch : warmup + (k + 1) * batch],
                    warmup + k * batch,
                )
                for k in range(count)
            ]
            timer.clear()
            started, cpu = time.perf_counter(), time.process_time()
            for body in bodies:
                with timer.stage("request: parse and validate the body"):
                    readings_in = ReadingsIn.model_validate_json(body)
                outcome = state.engine.ingest(stream, readings_in.readings)
                with timer.stage("answer: build ReadingsOut"):
                    answer = readings_api._answer(outcome, True)
                with timer.stage("response: serialise"):
                    to_json(answer)
            wall = time.perf_counter() - started
            per_request = {f"{stage} | cpu": 1e6 * timer.cpu[stage] / count for stage in ORDER}
            per_request |= {f"{stage} | wall": 1e6 * timer.wall[stage] / count for stage in ORDER}
            per_request["total | wall"] = 1e6 * wall / count
            per_request["total | cpu"] = 1e6 * (time.process_time() - cpu) / count
            results[batch] = per_request
    finally:
        state.database.dispose()
    return results


def print_table(results: dict[int, dict[str, float]]) -> None:
    """CPU and wall microseconds per request, stage by stage."""
    batches = sorted(results)
    print("| stage | " + " | ".join(f"batch {b:,}: CPU / wall us" for b in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    for stage in (*ORDER, "total"):
        cells = " | ".join(
            f"{results[b][f'{stage} | cpu']:,.0f} / {results[b][f'{stage} | wall']:,.0f}"
            for b in batches
        )
        print(f"| {stage} | {cells} |")
    for batch in batches:
        cpu, wall = results[batch]["total | cpu"], results[batch]["total | wall"]
        print(
            f"batch {batch:>5}: {batch * 1e6 / wall:>9,.0f} readings/s, {1e6 / wall:>7,.0f} "
            f"requests/s on the wall clock; {batch * 1e6 / cpu:>9,.0f} readings/s per CPU "
            "second (no HTTP)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--quick", action="store_true", help="A quarter of the requests.")
    parser.add_argument("--repeats", type=int, default=1, help="Medians over repeats.")
    parser.add_argument("--model-kind", choices=("lstm-stateful", "lstm"), default="lstm-stateful")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    use_one_thread()  # as the service does at start-up
    postgres_url = (
        args.postgres_url
        or os.environ.get("TWINWATCH_BENCH_DATABASE_URL")
        or os.environ.get("TWINWATCH_TEST_DATABASE_URL")
        or DEFAULT_POSTGRES
    )
    timer = StageTimer()
    instrument(timer)
    runs = []
    for _ in range(args.repeats):
        with (
            tempfile.TemporaryDirectory(prefix="twinwatch-stages-") as scratch,
            ExitStack() as stack,
        ):
            work = Path(scratch)
            if args.database == "sqlite":
                url = f"sqlite:///{(work / 'stages.db').as_posix()}"
            else:
                url = stack.enter_context(postgres_schema(postgres_url))
            runs.append(run(timer, url, work, 0.25 if args.quick else 1.0, args.model_kind))
    results = {
        batch: {stage: statistics.median(r[batch][stage] for r in runs) for stage in runs[0][batch]}
        for batch in runs[0]
    }
    print(f"{args.database}; {' '.join(sys.argv[1:])}")
    print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps({"command": sys.argv, "results": results}, indent=1))


if __name__ == "__main__":
    main()
