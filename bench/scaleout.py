"""1,000 streams through one embedded `twinwatch serve`, and through one API process with two
`twinwatch worker`s on the bus, side by side in one run: the readings per second each sustains.

    .venv/bin/python bench/scaleout.py [--speeds 1,2,3,4] [--seconds 15] [--streams 1000]
        [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Both set-ups run at once, each on a fresh PostgreSQL schema, with the same stateful LSTM
(bench/harness.py) and the same streams, created and warmed up through their own API. The load
is bench/streams.py's: two gateways, each posting one request for each of its 500 streams'
next reading through `POST /v1/readings`, on an absolute clock. At speed 1 that is 1,000
streams at 10 Hz (10,000 readings/s); speed s sends the same 10 Hz samples s times faster than
real time, to find where each set-up stops keeping up. Speeds take turns, the two set-ups in
alternating order, so both see the same machine. A set-up sustains a speed when it accepts
98% or more of the readings offered, with no error and a p99 under 250 ms.

CPU is counted per process family: the API (`serve`), the workers, the NATS server, and
PostgreSQL (every `postgres` process on the machine: run nothing else against it meanwhile);
the client's own CPU is reported too (it shares the machine's two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bus import start_nats  # (a script beside this one)
from harness import (
    CLOCK_TICKS,
    DEFAULT_POSTGRES,
    Server,
    machine_info,
    postgres_schema,
    stateful_model,
    twinwatch_server,
)
from ingest import series_values
from streams import (
    PERIOD_S,
    SERIES_LENGTH,
    WARMUP_EXTRA,
    Load,
    Sender,
    create_streams,
    drive,
    model_window,
    warm_up,
)

P99_LIMIT_MS = 250.0
KEPT_UP = 0.98  # of the readings offered, accepted


def postgres_cpu_seconds() -> float:
    """CPU of every `postgres` process now running (the server's and its backends')."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = raw.split("(", 1)[1].rsplit(")", 1)
        if name.startswith("postgres"):
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Setup:
    """One way of serving the streams: its API server, the processes whose CPU is its own, and
    where its streams stand (each gateway's next sample)."""

    name: str
    api: Server
    workers: list[Server] = field(default_factory=list)
    nats_pid: int | None = None
    load: Load | None = None
    sent: list[int] = field(default_factory=list)

    def cpu(self) -> dict[str, float]:
        out = {"api": self.api.cpu_seconds()}
        if self.workers:
            out["workers"] = sum(worker.cpu_seconds() for worker in self.workers)
        if self.nats_pid is not None:
            out["nats"] = process_cpu_seconds(self.nats_pid)
        out["postgresql"] = postgres_cpu_seconds()
        return out

    def stop(self) -> None:
        for process in [self.api, *self.workers]:
            process.stop()


def bus_setup(
    work: Path,
    database_url: str,
    models: Path,
    model: str,
    bus_url: str,
    nats_pid: int,
    partitions: int,
) -> Setup:
    api = twinwatch_server(
        "bus-api",
        database_url=database_url,
        models_dir=models,
        work=work,
        log_level="warning",
        default_model=model,
    )
    api.env = api.env | {"TWINWATCH_BUS_URL": bus_url, "TWINWATCH_BUS_PARTITIONS": str(partitions)}
    workers = []
    for index in range(2):
        env = api.env | {"TWINWATCH_DATA_DIR": str(work / f"worker-{index}-data")}
        command = [sys.executable, "-c", "from app.cli import main; main()", "worker"]
        workers.append(
            Server(
                f"worker-{index}",
                [*command, "--name", f"bench-{index}"],
                env,
                work / f"worker-{index}.log",
                port_option="--metrics-port",
            )
        )
    return Setup("bus: 1 API + 2 workers", api, workers, nats_pid)


async def prepare(setup: Setup, model: str, streams: int, samples: int) -> None:
    """Create and warm up the set-up's streams; its load then starts past the warm-up."""
    port = setup.api.port
    names = [f"scale-{i:05d}" for i in range(streams)]
    await create_streams(port, names, model)
    warm = await model_window(port, names[0]) + WARMUP_EXTRA
    values = series_values(SERIES_LENGTH)
    if warm + samples >= SERIES_LENGTH:
        raise SystemExit("too many samples for the series: fewer speeds or seconds")
    offsets = (np.arange(streams) * 13) % (SERIES_LENGTH - warm - samples)
    base_ms = int(time.time() * 1000) - 100 * (warm + samples)
    await warm_up(port, names, values, offsets, warm, base_ms, multi=True)
    setup.load = Load(port, names, values, offsets, warm, base_ms, 0, False, False)


def run_step(setup: Setup, speed: float, seconds: float, gateways: int) -> dict[str, Any]:
    """One speed through one set-up: its figures, its CPU per process family."""
    assert setup.load is not None
    period = PERIOD_S / speed
    load = setup.load
    load.period_s = period
    load.ticks = round(seconds / period)
    streams = len(load.names)
    sent = setup.sent or [0] * gateways
    senders = [
        Sender(list(range(g, streams, gateways)), ticks_sent=sent[g]) for g in range(gateways)
    ]
    before = setup.cpu()
    report = asyncio.run(drive(load, senders, None))
    after = setup.cpu()
    setup.sent = [sender.ticks_sent for sender in senders]
    cpu = {name: after[name] - before[name] for name in before}
    accepted = report["accepted"]
    report["cpu_s"] = cpu
    report["cpu_us_per_reading"] = (
        {name: 1e6 * value / accepted for name, value in cpu.items()} if accepted else None
    )
    report["kept_up"] = (
        report["errors"] == 0
        and report["readings_per_s"] >= KEPT_UP * report["offered_readings_per_s"]
        and report["p99_ms"] is not None
        and report["p99_ms"] < P99_LIMIT_MS
    )
    return report


def describe(name: str, speed: float, report: dict[str, Any]) -> str:
    cpu = report["cpu_us_per_reading"] or {}
    per_reading = ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
    mark = "kept up" if report["kept_up"] else "BEHIND"
    return (
        f"  {name:<24} x{speed:<4g} offered {report['offered_readings_per_s']:8,.0f}/s "
        f"sustained {report['readings_per_s']:8,.0f}/s  p50 {report['p50_ms'] or 0:7.1f} ms "
        f"p99 {report['p99_ms'] or 0:7.1f} ms  errors {report['errors']}  "
        f"missed {report['ticks_missed']}  {mark}  CPU us/reading: {per_reading}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speeds", default="1,1.5,2,2.5,3,4")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=64, help="The bus's (the default's).")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    speeds = [float(s) for s in args.speeds.split(",")]
    samples = sum(round(args.seconds * 10 * s) for s in speeds) + 10
    results: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="twinwatch-scale-")))
        model, _ = stateful_model(work / "models")
        nats, bus_url = start_nats(work)
        stack.callback(lambda: (nats.terminate(), nats.wait(timeout=60)))
        embedded_url = stack.enter_context(postgres_schema(args.postgres_url))
        bus_url_db = stack.enter_context(postgres_schema(args.postgres_url))
        embedded = Setup(
            "embedded serve",
            twinwatch_server(
                "embedded",
                database_url=embedded_url,
                models_dir=work / "models",
                work=work,
                log_level="warning",
                default_model=model,
            ),
        )
        bus = bus_setup(
            work, bus_url_db, work / "models", model, bus_url, nats.pid, args.partitions
        )
        setups = [embedded, bus]
        for setup in setups:
            stack.callback(setup.stop)
            setup.api.launch()
            setup.api.wait_ready("/readyz")
            for worker in setup.workers:
                worker.launch()
            for worker in setup.workers:
                worker.wait_ready("/metrics")
            started = time.perf_counter()
            asyncio.run(prepare(setup, model, args.streams, samples))
            print(f"{setup.name}: streams ready in {time.perf_counter() - started:.0f} s")
            results[setup.name] = []
        for index, speed in enumerate(speeds):
            for setup in setups if index % 2 == 0 else reversed(setups):
                report = run_step(setup, speed, args.seconds, args.gateways)
                report["speed"] = speed
                results[setup.name].append(report)
                print(describe(setup.name, speed, report), flush=True)
                time.sleep(2.0)  # the set-up's backlog, if any, drained before the next
    print()
    best = {}
    for name, reports in results.items():
        kept = [r for r in reports if r["kept_up"]]
        best[name] = max((r["readings_per_s"] for r in kept), default=0.0)
        print(f"{name}: sustains {best[name]:,.0f} readings/s (p99 < {P99_LIMIT_MS:g} ms)")
    if best[embedded.name]:
        print(f"ratio: {best[bus.name] / best[embedded.name]:.2f}")
    if args.json is not None:
        out = {"command": " ".join(sys.argv), "machine": machine_info(), "results": results}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
