"""Resident memory of `twinwatch serve` holding 10,000 warm streams, and what it is made of.

A real server process (uvicorn, one worker) on a SQLite file with a calibrated stateful LSTM
(`lstm-stateful`) as its default model. Each stream is created (`PUT /v1/streams/{id}`) and sent
enough readings to be in steady state: the model's window (the service's `warmup_remaining`,
256 for the stateful kind) plus the longest detector window (rolling RMS, 50) plus 4, so its
forecasts, residuals and every detector buffer are full. Readings go through the multi-stream
endpoint (`POST /v1/readings`, several streams a request) when the server has it, else one
request per stream, two connections at a time. VmRSS is read from /proc/<pid>/status after
start-up, at checkpoints while streams are added, and at the end; per stream = delta / streams.
The marginal cost is the slope between the first and the last checkpoint (the first streams
also pay one-off costs). With fewer than 10,000 streams (`--quick`: 1,000) the 10,000-stream
figure is extrapolated along that slope and flagged as such.

Then, in this process (`--no-analysis` skips it), what a stream costs, by tracemalloc:
- the Prometheus series a warm stream owns (the label children `track_stream`, the engine's
  thresholds and its per-batch gauges create), built on a fresh `app.metrics.Metrics`;
- the whole service path: the real app (`app.main.create_app`, lifespan included) driven
  in-process through Starlette's TestClient, N streams created and warmed exactly as above,
  the allocations still live afterwards grouped by the source file that made them.

    python bench/memory.py [--quick] [--streams 10000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    Connection,
    machine_info,
    stateful_model,
    twinwatch_server,
    vm_rss_mb,
)
from ingest import series_values
from streams import create_streams, model_window, multi_endpoint, warm_up

from app.monitoring.calibration import DetectorSettings

TARGET_STREAMS = 10_000
CHUNK = 100  # streams created and warmed per round (RSS is read between rounds)
SETTLE_S = 1.0


def readings_per_stream(window: int) -> int:
    """Steady state: the model's window, then enough residuals to fill every detector."""
    settings = DetectorSettings()
    return window + max(settings.rms_window, settings.floor_window, settings.level_window) + 4


# --- the server ---------------------------------------------------------------------------------


async def populate(
    port: int, pid: int, streams: int, *, multi: bool, checkpoints: int
) -> dict[str, Any]:
    """Create and warm `streams` streams, CHUNK at a time; RSS at `checkpoints` points."""
    prefix = f"m{int(time.time()) % 100000}"
    names = [f"{prefix}-{i:05d}" for i in range(streams)]
    await create_streams(port, names[:1], None)
    count = readings_per_stream(await model_window(port, names[0]))
    values = series_values(max(4 * count, 2000))
    offsets = (np.arange(streams) * 13) % (values.shape[0] - count)
    base_ms = int(time.time() * 1000) - 100 * count
    every = max(CHUNK, streams // checkpoints // CHUNK * CHUNK)
    curve: list[tuple[int, float]] = []
    started = time.perf_counter()
    for first in range(0, streams, CHUNK):
        chunk = names[first : first + CHUNK]
        await create_streams(port, [n for n in chunk if n != names[0]], None)
        await warm_up(port, chunk, values, offsets[first:], count, base_ms, multi=multi)
        done = first + len(chunk)
        if done % every == 0 or done == streams:
            curve.append((done, vm_rss_mb(pid)))
            rate = done / (time.perf_counter() - started)
            print(f"  {done:6,} streams  RSS {curve[-1][1]:7.1f} MiB  ({rate:.0f} streams/s)")
    seconds = time.perf_counter() - started
    return {
        "names": names,
        "readings_per_stream": count,
        "populate_s": seconds,
        "curve": curve,
    }


async def inspect(port: int, names: list[str], count: int) -> dict[str, Any]:
    """Check a few streams really are warm, and price the /metrics scrape."""
    connection = Connection(port)
    try:
        warm, idle = [], set()
        for name in (names[0], names[len(names) // 2], names[-1]):
            status, answer = await connection.request("GET", f"/v1/streams/{name}")
            stream = json.loads(answer)
            live = stream.get("live") or {}
            warm.append(
                status == 200
                and stream.get("samples_seen") == count
                and live.get("warmup_remaining") == 0
            )
            if not warm[-1]:
                print(f"  NOT WARM: {name}: {answer[:400]!r}")
            idle |= {k for k, d in live.get("detectors", {}).items() if d.get("statistic") is None}
        detectors = sorted(live.get("detectors", {}))
        started = time.perf_counter()
        status, body = await connection.request("GET", "/metrics")
        scrape_s = time.perf_counter() - started
    finally:
        await connection.close()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "streams_checked_warm": all(warm),
        "detectors_without_statistic": sorted(idle),  # e.g. `level` needs a reference
        "detectors": detectors,
        "metrics_scrape": {
            "status": status,
            "ms": 1000 * scrape_s,
            "bytes": len(body),
            "series": series,
            "series_per_stream": series / len(names),
        },
    }


def measure_server(streams: int, work: Path, log_level: str) -> dict[str, Any]:
    model, provenance = stateful_model(work / "models")
    server = twinwatch_server(
        "memory",
        database_url=f"sqlite:///{(work / 'memory.db').as_posix()}",
        models_dir=work / "models",
        work=work,
        log_level=log_level,
        default_model=model,
    )
    try:
        server.launch()
        server.wait_ready("/readyz")
        time.sleep(SETTLE_S)
        start_mb = vm_rss_mb(server.pid)
        multi, probe = asyncio.run(multi_endpoint(server.port))
        how = "POST /v1/readings" if multi else "one POST per stream (no multi-stream endpoint)"
        print(
            f"memory: {streams:,} streams, readings sent by {how}; RSS after start-up "
            f"{start_mb:.1f} MiB",
            flush=True,
        )
        filled = asyncio.run(
            populate(server.port, server.pid, streams, multi=multi, checkpoints=10)
        )
        checks = asyncio.run(inspect(server.port, filled["names"], filled["readings_per_stream"]))
        time.sleep(SETTLE_S)
        end_mb = vm_rss_mb(server.pid)
    finally:
        server.stop()
    per_stream_mb = (end_mb - start_mb) / streams
    curve = filled["curve"]
    # The first streams also pay one-off costs (the first batched forecasts, thread arenas):
    # the marginal cost is the slope after the first checkpoint.
    (n0, rss0), (n1, rss1) = curve[0], curve[-1]
    slope_mb = (rss1 - rss0) / (n1 - n0) if n1 > n0 else per_stream_mb
    at_target = end_mb + slope_mb * (TARGET_STREAMS - streams)
    return {
        "model": model,
        "model_provenance": provenance,
        "database": "sqlite",
        "multi_stream_endpoint": multi,
        "probe": probe,
        "streams": streams,
        "readings_per_stream": filled["readings_per_stream"],
        "populate_s": filled["populate_s"],
        "rss_mb_start": start_mb,
        "rss_mb_end": end_mb,
        "rss_curve_mb": filled["curve"],
        "per_stream_kb": 1024 * per_stream_mb,
        "marginal_per_stream_kb": 1024 * slope_mb,
        "rss_mb_10000_streams": at_target,
        "streams_mb_10000_streams": at_target - start_mb,  # the streams' share, start-up excluded
        "extrapolated": streams != TARGET_STREAMS,
        **checks,
    }


# --- in-process analysis ------------------------------------------------------------------------


def prometheus_per_stream(detectors: list[str], streams: int = 2000) -> dict[str, Any]:
    """Bytes of the Prometheus series one warm stream owns (its `StreamSeries`), on a fresh
    Metrics."""
    from app.metrics import Metrics

    metrics = Metrics()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(streams):
        stream = f"p-{i:05d}"
        series = metrics.track_stream(stream, detectors=detectors)  # PUT and the restore
        series.latest = np.full(2 + len(detectors), 0.1)  # what ingest sets per request
        series.kinds = tuple(detectors)
        for name in detectors:
            series.thresholds[name] = 1.0
            series.active[name] = False
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    series = sum(len(family.samples) for family in metrics.registry.collect())
    return {
        "streams": streams,
        "bytes_per_stream": grown / streams,
        "series_per_stream": series / streams,
    }


def service_per_stream(models: Path, model: str, streams: int, work: Path) -> dict[str, Any]:
    """The real app in-process (TestClient): live Python allocations per warm stream, by file."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(
        database_url=f"sqlite:///{(work / 'analysis.db').as_posix()}",
        models_dir=models,
        default_model=model,
        data_dir=work / "analysis-data",
        log_level="warning",
    )
    values = series_values(2000)

    def add(client: TestClient, name: str, count: int, offset: int) -> None:
        response = client.put(f"/v1/streams/{name}", json={})
        assert response.status_code == 201, response.text
        readings = [
            {"t": 1.7e9 + 0.1 * i, "value": float(v)}
            for i, v in enumerate(values[offset : offset + count])
        ]
        response = client.post(f"/v1/streams/{name}/readings", json={"readings": readings})
        assert response.status_code == 200, response.text[:300]

    with TestClient(create_app(settings)) as client:
        window = client.put("/v1/streams/first", json={}).json()["live"]["warmup_remaining"]
        count = readings_per_stream(window)
        client.delete("/v1/streams/first")
        for i in range(3):  # first-use allocations (caches, lazy imports) before the baseline
            add(client, f"warm-{i}", count, 7 * i)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for i in range(streams):
            add(client, f"a-{i:05d}", count, (13 * i) % (values.shape[0] - count))
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    total = sum(s.size_diff for s in diff)
    top = sorted(diff, key=lambda s: s.size_diff, reverse=True)[:10]
    root = str(Path(__file__).resolve().parents[1])
    return {
        "streams": streams,
        "readings_per_stream": count,
        "bytes_per_stream": total / streams,
        "by_file_bytes_per_stream": {
            s.traceback[0].filename.replace(root + "/", "").split("site-packages/")[-1]: (
                s.size_diff / streams
            )
            for s in top
        },
    }


def analyse(models: Path, model: str, detectors: list[str], streams: int, work: Path) -> Any:
    """Both in-process measurements; an error is reported, not raised (the service under test
    is being changed by others while this runs)."""
    out: dict[str, Any] = {}
    try:
        out["prometheus"] = prometheus_per_stream(detectors)
    except Exception as exc:
        out["prometheus"] = {"error": repr(exc)}
    try:
        out["service"] = service_per_stream(models, model, streams, work)
    except Exception as exc:
        out["service"] = {"error": repr(exc)}
    return out


# --- report -------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    flag = " (extrapolated)" if report["extrapolated"] else ""
    scrape = report["metrics_scrape"]
    print()
    print("| memory | |\n|---|---:|")
    rows = [
        ("streams (readings each)", f"{report['streams']:,} ({report['readings_per_stream']})"),
        ("time to create and warm them", f"{report['populate_s']:.0f} s"),
        ("streams checked warm", "yes" if report["streams_checked_warm"] else "NO"),
        ("RSS after start-up", f"{report['rss_mb_start']:.1f} MiB"),
        (f"RSS after {report['streams']:,} streams", f"{report['rss_mb_end']:.1f} MiB"),
        ("per stream: (end - start) / streams", f"{report['per_stream_kb']:.1f} KiB"),
        ("per stream: marginal (checkpoint slope)", f"{report['marginal_per_stream_kb']:.1f} KiB"),
        (f"RSS at 10,000 streams{flag}", f"{report['rss_mb_10000_streams']:.1f} MiB"),
        (f"of which the streams{flag}", f"{report['streams_mb_10000_streams']:.1f} MiB"),
        (
            "/metrics scrape",
            f"{scrape['ms']:.0f} ms, {scrape['bytes'] / 1e6:.1f} MB, "
            f"{scrape['series_per_stream']:.0f} series/stream",
        ),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    analysis = report.get("analysis")
    if not analysis:
        return
    prometheus, service = analysis["prometheus"], analysis["service"]
    print("\nin-process, tracemalloc (live Python allocations; RSS adds allocator overhead):")
    if "error" in prometheus:
        print(f"  Prometheus: failed: {prometheus['error']}")
    else:
        print(
            f"  Prometheus children of one warm stream: {prometheus['series_per_stream']:.0f} "
            f"series, {prometheus['bytes_per_stream'] / 1024:.1f} KiB"
        )
    if "error" in service:
        print(f"  the service in-process: failed: {service['error']}")
        return
    print(
        f"  the whole service path ({service['streams']} streams): "
        f"{service['bytes_per_stream'] / 1024:.1f} KiB per stream, by allocating file:"
    )
    for name, size in service["by_file_bytes_per_stream"].items():
        print(f"    {size / 1024:8.2f} KiB  {name}")


def run(
    *, quick: bool, streams: int | None, work: Path, log_level: str, analysis: bool
) -> dict[str, Any]:
    streams = streams or (1000 if quick else TARGET_STREAMS)
    report = measure_server(streams, work, log_level)
    if analysis:
        detectors = report["detectors"]
        report["analysis"] = analyse(
            work / "models", report["model"], detectors, 100 if quick else 300, work
        )
    print_report(report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 streams, extrapolated.")
    parser.add_argument("--streams", type=int, default=None, help="Default 10,000.")
    parser.add_argument("--log-level", default="warning", help="The server's log level.")
    parser.add_argument("--no-analysis", action="store_true", help="Skip the in-process part.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="twinwatch-memory-") as scratch:
        report = run(
            quick=args.quick,
            streams=args.streams,
            work=Path(scratch),
            log_level=args.log_level,
            analysis=not args.no_analysis,
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"command": " ".join(sys.argv), "machine": machine_info(), "memory": report}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
