"""A/B: one stream's ingest against `twinwatch serve` from two or more checkouts, interleaved.

The machine is shared and noisy (runs of the same code minutes apart differ by 20-40%), so a
change is measured against its base in one session: a server per checkout (each on its own
SQLite file, each with the stateful model its checkout ships), the same kind of request sent to
each in alternating rounds (a round of `--per-round` requests to each server, the order
reversed every round), and the median latency of each. `--ceiling` adds the last checkout's
parse-only ceiling (bench/parse_only.py) to the rounds and prints each server's ratio to it, as
bench/ingest.py does.

    git worktree add /tmp/base HEAD~1
    python bench/ab.py /tmp/base . --batch 1000 --rounds 20 --ceiling
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import Connection, Server, readings_body
from ingest import ACK_ONLY, PARSE_ONLY_PATH, READINGS_PATH, series_values

WARMUP = 300  # readings before the clock starts: a stateful stream forecasts after 256
UNTIMED = 5  # requests per server before the rounds


MODEL = "lstm-stateful-day-seed3"
"""The default model, shipped (with its thresholds) by every checkout in its own format."""


def server(checkout: Path, label: str, work: Path, model: str, *, ceiling: bool) -> Server:
    """`twinwatch serve` (or the parse-only ceiling) of `checkout`, its own SQLite file and its
    own copy of the shipped model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
    if not (checkout / "app" / "shipped_models").is_dir():  # before the models moved inside
        env["TWINWATCH_MODELS_DIR"] = str(checkout / "models")
    env |= {
        "PYTHONPATH": str(checkout),
        "TWINWATCH_DATABASE_URL": f"sqlite:///{(work / f'{label}.db').as_posix()}",
        "TWINWATCH_DEFAULT_MODEL": model,
        "TWINWATCH_DATA_DIR": str(work / f"{label}-data"),
        "TWINWATCH_MIGRATE_ON_START": "true",
        "TWINWATCH_LOG_LEVEL": "warning",
    }
    if ceiling:
        command = [sys.executable, str(checkout / "bench" / "parse_only.py")]
        command += ["--log-level", "warning"]
    else:
        command = [sys.executable, "-c", "from app.cli import main; main()", "serve"]
    return Server(label, command, env, work / f"{label}.log", cwd=checkout)


async def measure(
    targets: dict[str, tuple[Server, str]],
    bodies: list[bytes],
    rounds: int,
    per_round: int,
    cpu: dict[str, float],
) -> dict[str, list[float]]:
    """Each server's latencies; `cpu` gets the CPU seconds (all threads) it spent on them."""
    connections = {label: Connection(srv.port) for label, (srv, _) in targets.items()}
    position = dict.fromkeys(targets, 0)
    latencies: dict[str, list[float]] = {label: [] for label in targets}

    async def post(label: str, timed: bool) -> None:
        path = targets[label][1]
        started = time.perf_counter()
        status, answer = await connections[label].request("POST", path, bodies[position[label]])
        if timed:
            latencies[label].append(time.perf_counter() - started)
        position[label] += 1
        if status != 200:
            raise RuntimeError(f"{label}: POST {path}: {status} {answer[:300]!r}")

    try:
        for label in targets:
            for _ in range(UNTIMED):
                await post(label, timed=False)
        for label, (srv, _) in targets.items():
            cpu[label] = -srv.cpu_seconds()
        labels = list(targets)
        for round_number in range(rounds):
            for label in labels if round_number % 2 == 0 else labels[::-1]:
                for _ in range(per_round):
                    await post(label, timed=True)
        for label, (srv, _) in targets.items():
            cpu[label] += srv.cpu_seconds()
    finally:
        for connection in connections.values():
            await connection.close()
    return latencies


async def prepare(srv: Server, model: str, values: bytes) -> None:
    connection = Connection(srv.port)
    try:
        status, answer = await connection.request(
            "PUT", "/v1/streams/ab", json.dumps({"model": model}).encode()
        )
        if status != 201:
            raise RuntimeError(f"PUT: {status} {answer[:300]!r}")
        status, answer = await connection.request("POST", READINGS_PATH.format(stream="ab"), values)
        if status != 200:
            raise RuntimeError(f"warm-up: {status} {answer[:300]!r}")
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="Directories holding app/.")
    parser.add_argument("--batch", type=int, default=1000, help="Readings per request.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--ceiling", action="store_true", help="Add the parse-only ceiling.")
    args = parser.parse_args()
    requests = args.rounds * args.per_round + UNTIMED
    values = series_values(WARMUP + requests * args.batch)
    bodies = [
        readings_body(
            values[WARMUP + k * args.batch : WARMUP + (k + 1) * args.batch], WARMUP + k * args.batch
        )
        for k in range(requests)
    ]
    with tempfile.TemporaryDirectory(prefix="twinwatch-ab-") as tmp:
        work = Path(tmp)
        model = MODEL
        targets: dict[str, tuple[Server, str]] = {}
        try:
            for index, checkout in enumerate(args.checkouts):
                label = f"{index}:{checkout}"
                srv = server(checkout.resolve(), f"server-{index}", work, model, ceiling=False)
                targets[label] = (srv, READINGS_PATH.format(stream="ab") + ACK_ONLY)
            if args.ceiling:
                checkout = args.checkouts[-1].resolve()
                srv = server(checkout, "ceiling", work, model, ceiling=True)
                targets["ceiling"] = (srv, PARSE_ONLY_PATH.format(stream="ab"))
            for srv, _ in targets.values():
                srv.launch()
            for label, (srv, _) in targets.items():
                srv.wait_ready("/readyz" if label != "ceiling" else "/healthz")
                if label != "ceiling":
                    asyncio.run(prepare(srv, model, readings_body(values[:WARMUP], 0)))
            cpu: dict[str, float] = {}
            latencies = asyncio.run(measure(targets, bodies, args.rounds, args.per_round, cpu))
        finally:
            for srv, _ in targets.values():
                srv.stop()
    medians = {label: statistics.median(times) for label, times in latencies.items()}
    print(f"{args.batch} readings a request, {args.rounds} rounds of {args.per_round}:")
    for label, times in latencies.items():
        p10, p90 = (1000 * sorted(times)[len(times) * tenth // 10] for tenth in (1, 9))
        per_request = 1000 * cpu[label] / len(times)
        print(
            f"  {label}: median {1000 * medians[label]:.2f} ms, p10 {p10:.2f}, p90 {p90:.2f}, "
            f"server CPU {per_request:.2f} ms a request"
        )
    if args.ceiling:
        for label in latencies:
            if label != "ceiling":
                print(f"  {label}: {100 * medians['ceiling'] / medians[label]:.1f}% of the ceiling")


if __name__ == "__main__":
    main()
