"""Many live streams at once: 1,000 streams at 10 Hz each through `twinwatch serve`.

One Python process cannot serve 10,000 HTTP requests a second, so the load arrives the way a
digital twin or an edge collector would send it: G gateway connections (default 10), each
posting every 100 ms ONE request that carries one new reading for each of its 1000/G streams,
through the multi-stream endpoint

    POST /v1/readings  {"streams": [{"stream": "<id>", "readings": [{"t": .., "value": ..}]}, ..]}
    -> 200 {"streams": [{"stream": "<id>", "accepted": n, "duplicates": n, "results": [..],
                         "opened": [..], "closed": [..]}, ..]}   (request order; all or nothing)

Ticks run on an absolute clock (tick k is due at start + k * 100 ms), never sleep-after-send, so
a slow server shows up as latency and missed ticks instead of a silently lower rate. A gateway
sends its next tick only after the previous answer (one connection, each stream in order); when
an answer comes back after later ticks fell due, those ticks are skipped and counted as missed
(never sent), and the tick sent is counted late when it leaves more than half a period
after its due time. A request carries each of its streams' NEXT sample, on the 10 Hz sample grid
(consecutive times whatever the wall clock does), so a slow server never pushes the streams
back into warm-up with gaps: the work per reading stays what it is for a live stream.

Every stream uses a stateful LSTM (`lstm-stateful`; see harness.stateful_model) and is created
and warmed up (the model's window + 4 readings) before the clock starts. Reported: sustained
readings/s (accepted readings / elapsed), per-request latency p50/p99, errors (non-2xx answers,
connection failures, answers that do not match the request), missed and late ticks, and the
server's CPU seconds.

`--spread`: the gateways tick at evenly spread phases of the period (gateway g at g/G of it),
as independent gateways would, instead of all at the same instant (the default: the worst case,
where their requests always overlap).

`--per-stream`: every stream posts its own single-reading request to
`POST /v1/streams/{id}/readings` on its own connection (1,000 streams at 10 Hz = 10,000
requests/s; expected to fall far short on this machine: it shows why gateways batch).

    python bench/streams.py [--quick] [--gateways 10] [--per-stream] [--spread] [--json out.json]
    python bench/streams.py --port 8000 --model NAME   # against a server already running
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    DEFAULT_POSTGRES,
    Connection,
    Server,
    machine_info,
    postgres_schema,
    stateful_model,
    twinwatch_server,
)
from ingest import series_values

MULTI_PATH = "/v1/readings"
PERIOD_S = 0.1
WARMUP_EXTRA = 4  # readings past the model's window: every stream forecasts before the clock
STATEFUL_WINDOW = 256  # the stateful kind's window when the server does not say
SERIES_LENGTH = 6000  # values shared by all streams, each from its own offset
MAX_WARMUP_READINGS = 5000  # per multi-stream warm-up request


# --- the multi-stream contract ------------------------------------------------------------------


def epoch_text(ms: int) -> str:
    """Epoch seconds with exact milliseconds (a float would print 1764523852.3000002)."""
    return f"{ms // 1000}.{ms % 1000:03d}"


def multi_body(items: list[tuple[str, int, np.ndarray]], base_ms: int) -> bytes:
    """A `POST /v1/readings` body: (stream, first sample, values) per stream, time on the
    10 Hz sample grid from `base_ms` (epoch milliseconds of sample 0)."""
    parts = []
    for stream, first, values in items:
        readings = ",".join(
            f'{{"t":{epoch_text(base_ms + 100 * (first + i))},"value":{float(v)!r}}}'
            for i, v in enumerate(values)
        )
        parts.append(f'{{"stream":"{stream}","readings":[{readings}]}}')
    return ('{"streams":[' + ",".join(parts) + "]}").encode()


def check_multi_answer(status: int, answer: bytes, streams: list[str]) -> tuple[int, str | None]:
    """(accepted readings, None) for a well-formed 200, else (0, what was wrong)."""
    if status != 200:
        return 0, f"{status} {answer[:300]!r}"
    try:
        items = json.loads(answer)["streams"]
        if [item["stream"] for item in items] != streams:
            return 0, "the answer's streams are not the request's, in order"
        return sum(int(item["accepted"]) for item in items), None
    except (ValueError, KeyError, TypeError) as exc:
        return 0, f"malformed answer ({exc!r}): {answer[:300]!r}"


async def multi_endpoint(port: int) -> tuple[bool, str]:
    """Does the server have `POST /v1/readings`? An empty request is routed (200 or 422) if it
    does; 404/405 mean the route is missing."""
    connection = Connection(port)
    try:
        status, answer = await connection.request("POST", MULTI_PATH, b'{"streams":[]}')
    finally:
        await connection.close()
    detail = f"POST {MULTI_PATH} with no streams: {status} {answer[:200].decode(errors='replace')}"
    return status not in (404, 405), detail


# --- set-up -------------------------------------------------------------------------------------


async def create_streams(
    port: int, names: list[str], model: str | None, connections: int = 2
) -> None:
    """PUT every stream (`connections` at a time); refuses anything but 201."""
    body = json.dumps({"model": model} if model else {}).encode()
    queue = list(reversed(names))

    async def worker() -> None:
        connection = Connection(port)
        try:
            while queue:
                name = queue.pop()
                status, answer = await connection.request("PUT", f"/v1/streams/{name}", body)
                if status != 201:
                    raise RuntimeError(f"PUT {name}: {status} {answer[:300]!r}")
        finally:
            await connection.close()

    await asyncio.gather(*(worker() for _ in range(connections)))


async def model_window(port: int, stream: str) -> int:
    """Readings a fresh stream needs before it forecasts (the service's `warmup_remaining`)."""
    connection = Connection(port)
    try:
        status, answer = await connection.request("GET", f"/v1/streams/{stream}")
    finally:
        await connection.close()
    live = json.loads(answer).get("live") if status == 200 else None
    return int(live["warmup_remaining"]) if live else STATEFUL_WINDOW


async def warm_up(
    port: int,
    names: list[str],
    values: np.ndarray,
    offsets: np.ndarray,
    count: int,
    base_ms: int,
    *,
    multi: bool,
    connections: int = 2,
) -> None:
    """Send each stream its first `count` readings: through the multi-stream endpoint (several
    streams a request) when it exists, else one request per stream."""
    per_request = max(1, MAX_WARMUP_READINGS // count) if multi else 1
    total = len(names)
    groups = [list(range(i, min(i + per_request, total))) for i in range(0, total, per_request)]
    queue = list(reversed(groups))

    async def worker() -> None:
        connection = Connection(port)
        try:
            while queue:
                rows = queue.pop()
                if multi:
                    items = [(names[r], 0, values[offsets[r] : offsets[r] + count]) for r in rows]
                    status, answer = await connection.request(
                        "POST", MULTI_PATH, multi_body(items, base_ms)
                    )
                    _, problem = check_multi_answer(status, answer, [names[r] for r in rows])
                else:
                    (row,) = rows
                    body = stream_body(values[offsets[row] : offsets[row] + count], 0, base_ms)
                    path = f"/v1/streams/{names[row]}/readings"
                    status, answer = await connection.request("POST", path, body)
                    problem = None if status == 200 else f"{status} {answer[:300]!r}"
                if problem:
                    raise RuntimeError(f"warm-up of {[names[r] for r in rows][:3]}: {problem}")
        finally:
            await connection.close()

    await asyncio.gather(*(worker() for _ in range(connections)))


def stream_body(values: np.ndarray, first: int, base_ms: int) -> bytes:
    """A single stream's `POST .../readings` body on the same time grid."""
    items = ",".join(
        f'{{"t":{epoch_text(base_ms + 100 * (first + i))},"value":{float(v)!r}}}'
        for i, v in enumerate(values)
    )
    return f'{{"readings":[{items}]}}'.encode()


# --- the clock ----------------------------------------------------------------------------------


@dataclass
class Sender:
    """One connection's tally: a gateway, or one stream in --per-stream mode."""

    streams: list[int]
    ticks_sent: int = 0
    missed: int = 0
    late: int = 0
    accepted: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    last_answer: float = 0.0

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(what)


@dataclass
class Load:
    port: int
    names: list[str]
    values: np.ndarray
    offsets: np.ndarray
    warm: int  # readings each stream has before tick 0
    base_ms: int
    ticks: int
    per_stream: bool
    results: bool = True
    period_s: float = PERIOD_S  # between a sender's ticks (shorter: faster than real time)

    def body(self, rows: list[int], sequence: int) -> bytes:
        """The `sequence`-th request of a sender: each of its streams' next sample."""
        sample = self.warm + sequence
        if self.per_stream:
            (row,) = rows
            return stream_body(self.values[self.offsets[row] + sample][None], sample, self.base_ms)
        items = [(self.names[r], sample, self.values[self.offsets[r] + sample][None]) for r in rows]
        return multi_body(items, self.base_ms)


async def send(load: Load, sender: Sender, start: float) -> None:
    """Tick k at start + k * period; the next only after the answer; stale ticks skipped."""
    connection = Connection(load.port)
    names = [load.names[r] for r in sender.streams]
    path = f"/v1/streams/{names[0]}/readings" if load.per_stream else MULTI_PATH
    if not load.results:
        path += "?results=false"
    tick = 0
    try:
        while tick < load.ticks:
            due = start + tick * load.period_s
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = load.body(sender.streams, sender.ticks_sent)
            sent = time.perf_counter()
            if sent - due > load.period_s / 2:
                sender.late += 1
            sender.ticks_sent += 1
            try:
                status, answer = await connection.request("POST", path, body)
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                sender.error(f"connection: {exc!r}")
                await connection.close()
                connection = Connection(load.port)
                status, answer = 0, b""
            else:
                sender.latencies.append(time.perf_counter() - sent)
                if load.per_stream:
                    ok = status == 200 and answer.startswith(b'{"accepted":')
                    if ok:
                        sender.accepted += int(answer[12:].split(b",", 1)[0])
                    else:
                        sender.error(f"{status} {answer[:300]!r}")
                else:
                    accepted, problem = check_multi_answer(status, answer, names)
                    sender.accepted += accepted
                    if problem:
                        sender.error(problem)
            sender.last_answer = time.perf_counter()
            due_now = int((sender.last_answer - start) / load.period_s)  # the newest tick due
            following = max(tick + 1, min(due_now, load.ticks))
            sender.missed += following - (tick + 1)
            tick = following
    finally:
        await connection.close()


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def drive(
    load: Load, senders: list[Sender], server: Server | None, *, spread: bool = False
) -> dict[str, Any]:
    cpu = server.cpu_seconds() if server else None
    client_cpu = time.process_time()
    start = time.perf_counter() + 0.2  # every sender connected and waiting for tick 0
    # Together (the default, the worst case): every gateway's tick is due at the same instant.
    # Spread: independent gateways, each at its own phase of the period.
    phase = load.period_s / len(senders) if spread else 0.0
    await asyncio.gather(
        *(send(load, sender, start + index * phase) for index, sender in enumerate(senders))
    )
    duration = load.ticks * load.period_s
    elapsed = max(duration, max(s.last_answer for s in senders) - start)
    latencies = sorted(x for s in senders for x in s.latencies)
    accepted = sum(s.accepted for s in senders)
    errors = [e for s in senders for e in s.error_samples]
    server_cpu = None if server is None or cpu is None else server.cpu_seconds() - cpu
    client_cpu = time.process_time() - client_cpu
    return {
        "duration_s": duration,
        "elapsed_s": elapsed,
        "offered_readings_per_s": len(load.names) / load.period_s,
        "readings_per_s": accepted / elapsed,
        "accepted": accepted,
        "requests": sum(s.ticks_sent for s in senders),
        "ticks_scheduled": load.ticks * len(senders),
        "ticks_missed": sum(s.missed for s in senders),
        "ticks_late": sum(s.late for s in senders),
        "p50_ms": _ms(percentile(latencies, 0.50)),
        "p99_ms": _ms(percentile(latencies, 0.99)),
        "max_ms": _ms(latencies[-1] if latencies else None),
        "errors": sum(s.errors for s in senders),
        "error_samples": errors[:5],
        "server_cpu_s": server_cpu,
        "server_cpu_per_s": None if server_cpu is None else server_cpu / elapsed,
        "client_cpu_s": client_cpu,  # the client shares the 2 cores: is it a bottleneck?
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


# --- the whole benchmark ------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    streams: int = 1000
    gateways: int = 10
    seconds: float = 60.0
    per_stream: bool = False
    log_level: str = "info"
    port: int | None = None  # an already running server
    model: str | None = None  # with --port: the model to create streams with
    database: str = "sqlite"  # or "postgresql" (a fresh schema on --postgres-url)
    postgres_url: str = DEFAULT_POSTGRES
    results: bool = True  # False: ?results=false, the acknowledgement and alarms only
    spread: bool = False  # gateway g ticks g/G of a period after gateway 0 (default: together)


async def prepare(
    options: Options, port: int, model: str | None
) -> tuple[Load, bool, str, dict[str, Any]]:
    """Create and warm up the streams; returns the load, whether the multi endpoint exists and
    what the probe said, and set-up timings."""
    multi, probe = await multi_endpoint(port)
    timings: dict[str, Any] = {}
    prefix = f"s{int(time.time()) % 100000}"
    names = [f"{prefix}-{i:05d}" for i in range(options.streams)]
    ticks = round(options.seconds / PERIOD_S)
    if not multi and not options.per_stream:
        empty = Load(port, names, np.zeros(0), np.zeros(0, int), 0, 0, ticks, False)
        return empty, False, probe, timings
    started = time.perf_counter()
    await create_streams(port, names, model)
    timings["create_s"] = time.perf_counter() - started
    warm = await model_window(port, names[0]) + WARMUP_EXTRA
    values = series_values(SERIES_LENGTH)
    span = warm + ticks + 1
    offsets = (np.arange(options.streams) * 13) % (SERIES_LENGTH - span)
    base_ms = int(time.time() * 1000) - 100 * warm
    started = time.perf_counter()
    await warm_up(port, names, values, offsets, warm, base_ms, multi=multi)
    timings["warmup_s"] = time.perf_counter() - started
    timings["warmup_readings_per_stream"] = warm
    load = Load(
        port, names, values, offsets, warm, base_ms, ticks, options.per_stream, options.results
    )
    return load, multi, probe, timings


def senders_for(options: Options) -> list[Sender]:
    if options.per_stream:
        return [Sender([row]) for row in range(options.streams)]
    return [
        Sender(list(range(g, options.streams, options.gateways))) for g in range(options.gateways)
    ]


def measure(
    options: Options, server: Server | None, port: int, model: str | None
) -> dict[str, Any]:
    mode = "per-stream" if options.per_stream else f"{options.gateways} gateways"
    report: dict[str, Any] = {
        "mode": mode,
        "streams": options.streams,
        "hz_per_stream": 1 / PERIOD_S,
        "seconds": options.seconds,
        "model": model,
    }
    load, multi, probe, timings = asyncio.run(prepare(options, port, model))
    report |= {"multi_stream_endpoint": multi, "probe": probe, "setup": timings}
    if not multi and not options.per_stream:
        report["error"] = f"the multi-stream endpoint is missing ({probe})"
        report |= dict.fromkeys(("readings_per_s", "p50_ms", "p99_ms", "errors"))
        return report
    senders = senders_for(options)
    print(
        f"streams: {options.streams} streams at 10 Hz, {mode}, {options.seconds:g} s "
        f"(set-up {timings.get('create_s', 0):.0f} s create + "
        f"{timings.get('warmup_s', 0):.0f} s warm-up)",
        flush=True,
    )
    report |= asyncio.run(drive(load, senders, server, spread=options.spread))
    report["gateway_phases"] = "spread" if options.spread else "together"
    return report


def print_report(report: dict[str, Any]) -> None:
    print()
    if report.get("error"):
        print(f"streams ({report['mode']}): NOT MEASURED: {report['error']}")
        return

    def fmt(value: Any, spec: str = ",.0f") -> str:
        return "n/a" if value is None else format(value, spec)

    rows = [
        ("mode", f"{report['mode']}, {report.get('gateway_phases', 'together')}"),
        ("streams x rate", f"{report['streams']:,} x 10 Hz for {report['seconds']:g} s"),
        ("offered readings/s", fmt(report["offered_readings_per_s"])),
        ("sustained readings/s", fmt(report["readings_per_s"])),
        (
            "requests (ticks sent / scheduled)",
            f"{report['requests']:,} / {report['ticks_scheduled']:,}",
        ),
        ("ticks missed / late", f"{report['ticks_missed']:,} / {report['ticks_late']:,}"),
        (
            "latency p50 / p99 / max ms",
            f"{fmt(report['p50_ms'], '.1f')} / {fmt(report['p99_ms'], '.1f')} / "
            f"{fmt(report['max_ms'], '.1f')}",
        ),
        ("errors", f"{report['errors']:,}"),
        (
            "server CPU s (per wall s)",
            f"{fmt(report['server_cpu_s'], '.1f')} ({fmt(report['server_cpu_per_s'], '.2f')})",
        ),
        ("client CPU s", f"{report['client_cpu_s']:.1f}"),
    ]
    print("| streams | |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for sample in report["error_samples"]:
        print(f"  error: {sample}")


def run(options: Options, work: Path) -> dict[str, Any]:
    """Start a server on SQLite with a stateful model (unless `options.port`), measure, print."""
    if options.port is not None:
        report = measure(options, None, options.port, options.model)
        print_report(report)
        return report
    model, provenance = stateful_model(work / "models")
    with ExitStack() as stack:
        if options.database == "postgresql":
            database_url = stack.enter_context(postgres_schema(options.postgres_url))
        else:
            database_url = f"sqlite:///{(work / 'streams.db').as_posix()}"
        server = twinwatch_server(
            "streams",
            database_url=database_url,
            models_dir=work / "models",
            work=work,
            log_level=options.log_level,
            default_model=model,
        )
        try:
            server.launch()
            server.wait_ready("/readyz")
            report = measure(options, server, server.port, model)
        finally:
            server.stop()
    report["model_provenance"] = provenance
    report["database"] = options.database
    report["results"] = options.results
    print_report(report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s instead of 60 s.")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--per-stream", action="store_true", help="One request per reading.")
    parser.add_argument("--log-level", default="info", help="The server's (info: the default).")
    parser.add_argument("--port", type=int, default=None, help="Use a server already running.")
    parser.add_argument("--model", default=None, help="With --port: the streams' model.")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--no-results", action="store_true", help="Post with ?results=false.")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="Gateways tick at evenly spread phases of the period instead of all at once.",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.streams % args.gateways and not args.per_stream:
        parser.error("--streams must be a multiple of --gateways")
    options = Options(
        streams=args.streams,
        gateways=args.gateways,
        seconds=args.seconds or (10.0 if args.quick else 60.0),
        per_stream=args.per_stream,
        log_level=args.log_level,
        port=args.port,
        model=args.model,
        database=args.database,
        postgres_url=args.postgres_url,
        results=not args.no_results,
        spread=args.spread,
    )
    with tempfile.TemporaryDirectory(prefix="twinwatch-streams-") as scratch:
        report = run(options, Path(scratch))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"command": " ".join(sys.argv), "machine": machine_info(), "options": asdict(options)}
        args.json.write_text(json.dumps(out | {"streams": report}, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
