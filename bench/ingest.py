"""Ingest throughput of `twinwatch serve`: readings per second with durable commit.

Against real server processes (uvicorn, one worker) over loopback, with the real default LSTM
(a copy calibrated on the lab hold-out), on SQLite (a file, WAL, synchronous=FULL) and
PostgreSQL (a fresh schema on a local server; synchronous_commit as the server has it), plus a
parse-only ceiling (the same payloads to an endpoint of the same FastAPI app that only
validates them; see bench/parse_only.py). Every 2xx of the service means the batch is committed.
`--model-kind lstm-stateful` gives every stream a calibrated stateful LSTM instead (warmed up
with its window of 256 + 4 readings); the report says which kind ran.

Each database is measured twice: with the full answer (one result per reading) and with
`?results=false` (target `<database>-ack`: the acknowledgement and the alarms, the same answer as
the parse-only ceiling's), each against its own ceiling.

Workloads: one stream with batches of 1, 100 and 1,000 (one request at a time, as one stream's
readings must arrive in order), and 100 streams posting concurrently (one connection each) with
batches of 10 and 100. Each stream is created and warmed up (100 readings) before the clock
starts. The configurations run round-robin in one session, `--repeats` times, and the table
shows the best and the median (the machine is shared: ratios within a session are what count).

    python bench/ingest.py                          # SQLite and PostgreSQL, 3 repeats
    python bench/ingest.py --quick                  # a smoke run (1-2 minutes)
    python bench/ingest.py --database sqlite --json out.json
    python bench/ingest.py --quick --profile prof/  # + py-spy profiles: time per stage
    python bench/ingest.py --model-kind lstm-stateful

PostgreSQL URL: --postgres-url, else $TWINWATCH_BENCH_DATABASE_URL, else
$TWINWATCH_TEST_DATABASE_URL, else postgresql+psycopg://postgres@127.0.0.1:5432/test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    DEFAULT_MODEL,
    DEFAULT_POSTGRES,
    ROOT,
    Connection,
    Server,
    calibrated_models,
    parse_only_server,
    postgres_schema,
    readings_body,
    stateful_model,
    twinwatch_server,
)
from stacks import summarise_profile

from app.simulation.twin import DuffingMachine, simulate_series

WARMUP_READINGS = 100  # more than the model's window of 64: every timed reading is forecast
STATEFUL_WARMUP_EXTRA = 4  # a stateful model's window (256) + 4: every timed reading forecast
READINGS_PATH = "/v1/streams/{stream}/readings"
ACK_ONLY = "?results=false"  # the answer is the acknowledgement and the alarms, as parse-only's
PARSE_ONLY_PATH = "/v1/parse-only/{stream}/readings"  # the ceiling, inside the real app
ECHO_PATH = "/v1/echo/{stream}/readings"  # the parse+answer ceiling
MODEL_KINDS = ("lstm", "lstm-stateful")
CEILING_WARMUP = 20  # untimed requests per stream before a ceiling workload
PROFILE_RUN = 999  # the "repeat" number of profiled runs (fresh stream names)


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    streams: int
    batch: int
    requests: int  # per stream
    quick_requests: int


WORKLOADS = (
    Workload("s1-b1", "1 stream, batch 1", 1, 1, 1500, 200),
    Workload("s1-b100", "1 stream, batch 100", 1, 100, 200, 30),
    Workload("s1-b1000", "1 stream, batch 1,000", 1, 1000, 30, 6),
    Workload("s100-b10", "100 streams, batch 10", 100, 10, 15, 3),
    Workload("s100-b100", "100 streams, batch 100", 100, 100, 5, 2),
)


@dataclass
class Target:
    """Somewhere to post readings: the service on one database, or a ceiling endpoint."""

    name: str
    server: Server
    path: str  # with {stream}
    stateful: bool  # streams must be created and warmed up
    warmup: int = WARMUP_READINGS  # readings sent to each stream before the clock starts
    streams_suffix: str = ""  # keeps the stream names of two targets of one server apart

    def url(self, stream: str) -> str:
        return self.path.format(stream=stream)


@dataclass
class Measurement:
    target: str
    workload: str
    repeat: int
    seconds: float
    readings: int
    requests: int
    server_cpu_s: float
    client_cpu_s: float
    latency_p50_ms: float
    latency_p99_ms: float

    @property
    def readings_per_s(self) -> float:
        return self.readings / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


@dataclass
class Session:
    values: np.ndarray
    measurements: list[Measurement] = field(default_factory=list)
    profiles: dict[str, Any] = field(default_factory=dict)


def series_values(count: int) -> np.ndarray:
    """The twin (seed 1) with its slow drift removed, so a long stream stays in training range."""
    series = simulate_series(1, count)
    drift = DuffingMachine().drift_per_sample * np.arange(count)
    return np.asarray(series.value - drift, dtype=np.float64)


def expected_prefix(count: int) -> bytes:
    return b'{"accepted":%d' % count


async def prepare_streams(target: Target, names: list[str], values: np.ndarray) -> None:
    """Create the streams (default model) and warm them up; untimed."""
    connection = Connection(target.server.port)
    try:
        for name in names:
            status, body = await connection.request("PUT", f"/v1/streams/{name}", b"{}")
            if status != 201:
                raise RuntimeError(f"PUT {name}: {status} {body[:300]!r}")
            status, body = await connection.request(
                "POST", target.url(name), readings_body(values[: target.warmup], 0)
            )
            if status != 200:
                raise RuntimeError(f"warm-up of {name}: {status} {body[:300]!r}")
    finally:
        await connection.close()


async def post_all(
    port: int, path: str, bodies: list[bytes], batch: int, latencies: list[float]
) -> None:
    """One stream's requests, one at a time on one connection, each checked."""
    connection = Connection(port)
    await connection.open()
    prefix = expected_prefix(batch)
    try:
        for body in bodies:
            started = time.perf_counter()
            status, answer = await connection.request("POST", path, body)
            latencies.append(time.perf_counter() - started)
            if status != 200 or not answer.startswith(prefix):
                raise RuntimeError(f"POST {path}: {status} {answer[:300]!r}")
    finally:
        await connection.close()


async def run_workload(
    target: Target, workload: Workload, repeat: int, values: np.ndarray, requests: int
) -> Measurement:
    suffix = target.streams_suffix
    names = [f"{workload.key}-r{repeat}-{i}{suffix}" for i in range(workload.streams)]
    if target.stateful:
        await prepare_streams(target, names, values)
    warm = target.warmup
    bodies = [
        readings_body(
            values[warm + k * workload.batch : warm + (k + 1) * workload.batch],
            warm + k * workload.batch,
        )
        for k in range(requests)
    ]
    if not target.stateful:  # the ceiling: untimed requests first (thread pool, first use)
        for name in names:
            await post_all(
                target.server.port,
                target.url(name),
                bodies[:1] * CEILING_WARMUP,
                workload.batch,
                [],
            )
    latencies: list[float] = []
    server_cpu = target.server.cpu_seconds()
    client_cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(
        *(
            post_all(target.server.port, target.url(name), bodies, workload.batch, latencies)
            for name in names
        )
    )
    seconds = time.perf_counter() - started
    latencies.sort()
    return Measurement(
        target=target.name,
        workload=workload.key,
        repeat=repeat,
        seconds=seconds,
        readings=workload.streams * workload.batch * requests,
        requests=workload.streams * requests,
        server_cpu_s=target.server.cpu_seconds() - server_cpu,
        client_cpu_s=time.process_time() - client_cpu,
        latency_p50_ms=1000 * latencies[len(latencies) // 2],
        latency_p99_ms=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    )


def profile_workload(
    target: Target, workload: Workload, values: np.ndarray, requests: int, out: Path
) -> dict[str, Any]:
    """Run the workload once under py-spy (sampling every thread, idle included)."""
    raw = out / f"{target.name}-{workload.key}.txt"
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).is_file():
        raise SystemExit("--profile needs py-spy: pip install 'py-spy>=0.4,<1'")
    command = [py_spy, "record", "--pid", str(target.server.pid), "--rate", "1000", "--idle"]
    command += ["--format", "raw", "--output", str(raw), "--nonblocking"]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    measurement = asyncio.run(run_workload(target, workload, PROFILE_RUN, values, requests))
    spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
    _, errors = spy.communicate(timeout=60)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote nothing: {errors.decode()[-2000:]}")
    summary = summarise_profile(raw.read_text(), requests=measurement.requests)
    summary["wall_ms_per_request"] = 1000 * measurement.seconds / measurement.requests
    summary["measurement"] = asdict(measurement)
    return summary


def summarise(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """Best and median per (target, workload)."""
    rows = []
    keys = sorted({(m.target, m.workload) for m in measurements}, key=lambda k: (k[1], k[0]))
    for target, workload in keys:
        group = [m for m in measurements if m.target == target and m.workload == workload]
        rates = [m.readings_per_s for m in group]
        requests = [m.requests_per_s for m in group]
        rows.append(
            {
                "target": target,
                "workload": workload,
                "repeats": len(group),
                "readings_per_s_best": max(rates),
                "readings_per_s_median": statistics.median(rates),
                "requests_per_s_best": max(requests),
                "requests_per_s_median": statistics.median(requests),
                "latency_p50_ms_median": statistics.median(m.latency_p50_ms for m in group),
                "latency_p99_ms_median": statistics.median(m.latency_p99_ms for m in group),
                "server_cpu_ms_per_request": statistics.median(
                    1000 * m.server_cpu_s / m.requests for m in group
                ),
                "client_cpu_ms_per_request": statistics.median(
                    1000 * m.client_cpu_s / m.requests for m in group
                ),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    labels = {w.key: w.label for w in WORKLOADS}
    print()
    print(
        "| workload | target | readings/s best | median | requests/s median "
        "| p50 / p99 ms | server CPU ms/request |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {labels[row['workload']]} | {row['target']} "
            f"| {row['readings_per_s_best']:,.0f} | {row['readings_per_s_median']:,.0f} "
            f"| {row['requests_per_s_median']:,.0f} "
            f"| {row['latency_p50_ms_median']:.2f} / {row['latency_p99_ms_median']:.2f} "
            f"| {row['server_cpu_ms_per_request']:.2f} |"
        )


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "git_commit": commit,
    }


@dataclass(frozen=True)
class Options:
    quick: bool
    repeats: int
    workloads: list[Workload]
    databases: list[str]
    postgres_url: str
    log_level: str
    ceiling: bool
    profile: Path | None
    json: Path | None
    model_kind: str = "lstm-stateful"
    ack_only: bool = True  # also post with ?results=false

    def requests(self, workload: Workload) -> int:
        return workload.quick_requests if self.quick else workload.requests


def parse_options() -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Few requests, one repeat.")
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--repeats", type=int, default=None, help="Default 3 (1 with --quick).")
    parser.add_argument("--workloads", default=",".join(w.key for w in WORKLOADS))
    parser.add_argument(
        "--log-level", default="info", help="The servers' log level (info: the default)."
    )
    parser.add_argument("--json", type=Path, default=None, help="Write every figure here.")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy profiles here.")
    parser.add_argument("--no-ceiling", action="store_true", help="Skip the parse-only target.")
    parser.add_argument(
        "--no-ack-only",
        action="store_true",
        help="Skip the targets that post with ?results=false (answer: acknowledgement and "
        "alarms only, like the parse-only ceiling's).",
    )
    parser.add_argument(
        "--model-kind",
        choices=MODEL_KINDS,
        default="lstm-stateful",
        help="Every stream's model: a stateful LSTM (the service default's kind) or the "
        "window LSTM.",
    )
    args = parser.parse_args()
    keys = args.workloads.split(",")
    unknown = set(keys) - {w.key for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown workload(s) {sorted(unknown)}")
    return Options(
        quick=args.quick,
        repeats=args.repeats or (1 if args.quick else 3),
        workloads=[w for w in WORKLOADS if w.key in keys],
        databases=["sqlite", "postgresql"] if args.database == "both" else [args.database],
        postgres_url=args.postgres_url
        or os.environ.get("TWINWATCH_BENCH_DATABASE_URL")
        or os.environ.get("TWINWATCH_TEST_DATABASE_URL")
        or DEFAULT_POSTGRES,
        log_level=args.log_level,
        ceiling=not args.no_ceiling,
        ack_only=not args.no_ack_only,
        profile=args.profile,
        json=args.json,
        model_kind=args.model_kind,
    )


@dataclass(frozen=True)
class ModelChoice:
    """The model every stream of the service gets, and how far to warm a stream up."""

    kind: str
    name: str
    provenance: str
    warmup: int


def choose_model(options: Options, work: Path) -> tuple[Path, ModelChoice]:
    """A models directory with the calibrated window LSTM (and the stateful one if asked)."""
    models = calibrated_models(work)
    if options.model_kind == "lstm-stateful":
        name, provenance = stateful_model(models)
        window = int(json.loads((models / name / "manifest.json").read_text())["window"])
        choice = ModelChoice("lstm-stateful", name, provenance, window + STATEFUL_WARMUP_EXTRA)
    else:
        choice = ModelChoice("lstm", DEFAULT_MODEL, f"models/{DEFAULT_MODEL}", WARMUP_READINGS)
    return models, choice


def build_targets(
    options: Options,
    stack: ExitStack,
    work: Path,
    models: Path,
    model: ModelChoice | None = None,
) -> list[Target]:
    """A server per database plus the ceiling; not started yet."""
    model = model or ModelChoice("lstm", DEFAULT_MODEL, "", WARMUP_READINGS)
    targets: list[Target] = []
    for database in options.databases:
        for name in (database,):
            if database == "sqlite":
                url = f"sqlite:///{(work / f'{name}.db').as_posix()}"
            else:
                url = stack.enter_context(postgres_schema(options.postgres_url))
            server = twinwatch_server(
                name,
                database_url=url,
                models_dir=models,
                work=work,
                log_level=options.log_level,
                default_model=model.name,
            )
            targets.append(Target(name, server, READINGS_PATH, True, model.warmup))
            if options.ack_only:
                targets.append(
                    Target(
                        f"{name}-ack",
                        server,
                        READINGS_PATH + ACK_ONLY,
                        True,
                        model.warmup,
                        streams_suffix="-ack",
                    )
                )
    if options.ceiling:
        ceiling = parse_only_server(
            "ceiling",
            work=work,
            log_level=options.log_level,
            models_dir=models,
            default_model=model.name,
        )
        targets.append(Target("parse-only", ceiling, PARSE_ONLY_PATH, False, model.warmup))
        targets.append(Target("parse+answer", ceiling, ECHO_PATH, False, model.warmup))
    return targets


def start(targets: list[Target], stack: ExitStack) -> None:
    """Launch every server at once (they import torch side by side), then wait for each."""
    servers = list({id(t.server): t.server for t in targets}.values())
    for server in servers:
        stack.callback(server.stop)
        server.launch()
    for target in targets:
        target.server.wait_ready("/readyz" if target.stateful else "/healthz")


def measure_all(options: Options, targets: list[Target], session: Session) -> None:
    """Every (workload, target) once per repeat, round-robin, so drift hits all alike."""
    for repeat in range(options.repeats):
        for workload in options.workloads:
            for target in targets:
                requests = options.requests(workload)
                m = asyncio.run(run_workload(target, workload, repeat, session.values, requests))
                session.measurements.append(m)
                print(
                    f"[{repeat + 1}/{options.repeats}] {workload.label:24} {target.name:14} "
                    f"{m.readings_per_s:10,.0f} readings/s {m.requests_per_s:8,.0f} requests/s "
                    f"server CPU {1000 * m.server_cpu_s / m.requests:6.2f} ms/request",
                    flush=True,
                )


def profile_all(options: Options, targets: list[Target], session: Session, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for workload in options.workloads:
        for target in targets:
            if target.path == ECHO_PATH:
                continue
            summary = profile_workload(
                target, workload, session.values, options.requests(workload), out
            )
            session.profiles[f"{target.name}/{workload.key}"] = summary
            print(
                f"\nprofile {target.name} / {workload.label}: "
                f"{summary['wall_ms_per_request']:.2f} ms wall per request; "
                "busy time per request by stage (all threads):"
            )
            for stage, us in summary["us_per_request"].items():
                print(f"  {stage:42} {us:9.1f} us")


def run(options: Options, info: dict[str, Any]) -> dict[str, Any]:
    """Measure every (workload, target), print the table; returns the report (as --json)."""
    most = max(w.batch * options.requests(w) for w in options.workloads)
    with tempfile.TemporaryDirectory(prefix="twinwatch-bench-") as scratch:
        work = Path(scratch)
        models, model = choose_model(options, work)
        session = Session(values=series_values(model.warmup + most))
        print(f"ingest: every stream's model is {model.name} ({model.kind}; {model.provenance})")
        with ExitStack() as stack:
            targets = build_targets(options, stack, work, models, model)
            start(targets, stack)
            measure_all(options, targets, session)
            if options.profile is not None:
                profile_all(options, targets, session, options.profile)

    rows = summarise(session.measurements)
    print_table(rows)
    info["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    return {
        "command": " ".join(sys.argv),
        "machine": info,
        "quick": options.quick,
        "repeats": options.repeats,
        "model": asdict(model),
        "summary": rows,
        "measurements": [
            asdict(m) | {"readings_per_s": m.readings_per_s, "requests_per_s": m.requests_per_s}
            for m in session.measurements
        ],
        "profiles": session.profiles,
    }


def main() -> None:
    options = parse_options()
    report = run(options, machine())
    if options.json is not None:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {options.json}")


if __name__ == "__main__":
    main()
