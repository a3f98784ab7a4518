"""The operator's pages of a server with 10,000 streams: how long the streams page takes to
answer (first, in the middle, filtered by an id prefix), the alarms page, a stream's page and
its summary (fetched again every 2 s to follow it), and what its chart fetches for the last
10 minutes, hour and day of a 10 Hz stream.

    .venv/bin/python bench/pages.py [--streams 10000] [--requests 30] [--chart-hours 24]

The streams are written straight into a SQLite database (as a server restarted with them would
find them: bench/fleet.py does the same), a real `twinwatch serve` starts on them, and each
stream gets one reading so that it has a live position; one more stream gets `--chart-hours`
of 10 Hz readings. Each kind of request is made `--requests` times (the chart's day 5 times),
one at a time, and the median and the slowest are printed.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import MODEL, serve, stop, stream_rows  # (a script beside this one)

from app.storage.db import Database
from app.storage.models import Stream


def timed(client: httpx.Client, path: str, requests: int) -> tuple[float, float, str]:
    """Median and slowest milliseconds of `requests` GETs, and the last page."""
    seconds, body = [], ""
    for _ in range(requests):
        started = time.perf_counter()
        answer = client.get(path)
        seconds.append(time.perf_counter() - started)
        answer.raise_for_status()
        body = answer.text
    return statistics.median(seconds) * 1000, max(seconds) * 1000, body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--chart-hours", type=float, default=24.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(scratch)
        url = f"sqlite:///{data_dir / 'twinwatch.db'}"
        process, _ = serve(url, data_dir, "alarms")  # migrates, registers the models
        stop(process)
        now = datetime.now(UTC)
        ids = [f"fleet-{i:06d}" for i in range(args.streams)]
        database = Database(url)
        with database.session() as session:
            session.execute(insert(Stream), stream_rows(ids, now))
        database.dispose()
        process, base = serve(url, data_dir, "alarms")
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                t = time.time()
                tick = {
                    "streams": [{"stream": i, "readings": [{"t": t, "value": 0.0}]} for i in ids]
                }
                client.post("/v1/readings?results=false", json=tick).raise_for_status()
                first = timed(client, "/", args.requests)
                assert re.search(r"cursor=", first[2]), "the first page links no next page"
                # The cursor names the last stream before the page (base64 of its id).
                half = ids[len(ids) // 2].encode()
                middle_cursor = base64.urlsafe_b64encode(half).decode().rstrip("=")
                middle = timed(client, f"/?cursor={middle_cursor}", args.requests)
                filtered = timed(client, "/?q=fleet-0050", args.requests)
                alarms = timed(client, "/alarms", args.requests)
                charted, end = chart_stream(client, args.chart_hours)
                stream = timed(client, f"/streams/{charted}", args.requests)
                facts = timed(client, f"/streams/{charted}/facts", args.requests)
                charts = {
                    label: timed(client, chart_path(charted, end, seconds), requests)
                    for label, seconds, requests in (
                        ("chart, last 10 min", 600, args.requests),
                        ("chart, last hour", 3600, args.requests),
                        (f"chart, last {args.chart_hours:g} h", args.chart_hours * 3600, 5),
                    )
                }
        finally:
            stop(process)
        print(f"{args.streams:,} streams (SQLite), {args.requests} requests each, one at a time")
        for name, (median, slowest, body) in (
            ("first page", first),
            ("a page in the middle", middle),
            ("filtered by id prefix", filtered),
        ):
            rows = body.count("<tr data-stream")
            print(f"{name:24} median {median:6.1f} ms, slowest {slowest:6.1f} ms ({rows} rows)")
        for name, (median, slowest, _) in (
            ("alarms page", alarms),
            ("a stream's page", stream),
            ("its summary", facts),
        ):
            print(f"{name:24} median {median:6.1f} ms, slowest {slowest:6.1f} ms")
        for name, (median, slowest, body) in charts.items():
            points = len(json.loads(body)["t"])
            print(f"{name:24} median {median:6.1f} ms, slowest {slowest:6.1f} ms ({points} points)")


CHART_READINGS_A_POST = 5_000


def chart_stream(client: httpx.Client, hours: float) -> tuple[str, float]:
    """A stream of the shipped model with `hours` of 10 Hz readings ending now (sine and
    noise): its id and the time of its last reading."""
    stream = "chart-1"
    client.put(f"/v1/streams/{stream}", json={"model": MODEL}).raise_for_status()
    count = int(hours * 36_000)
    end = time.time()
    times = end - (count - 1 - np.arange(count)) * 0.1
    values = np.sin(np.arange(count) * 0.05) + np.random.default_rng(0).normal(0, 0.05, count)
    for first in range(0, count, CHART_READINGS_A_POST):
        part = slice(first, first + CHART_READINGS_A_POST)
        readings = [
            {"t": t, "value": v}
            for t, v in zip(times[part].tolist(), values[part].tolist(), strict=True)
        ]
        client.post(
            f"/v1/streams/{stream}/readings?results=false", json={"readings": readings}
        ).raise_for_status()
    return stream, float(times[-1])


def chart_path(stream: str, end: float, seconds: float) -> str:
    """What the stream page's chart asks for to show `seconds` up to `end` (static/stream.js):
    every reading up to 10,000 of them, else 1,000 buckets."""
    step = f"&step_s={seconds / 1000:.3f}" if seconds / 0.1 > 10_000 else ""
    return f"/v1/streams/{stream}/readings?since={end - seconds:.3f}&until={end + 0.001:.3f}{step}"


if __name__ == "__main__":
    main()
