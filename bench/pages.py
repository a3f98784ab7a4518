"""The operator's streams page (`GET /`) of a server with 10,000 streams: how long a page takes
to answer, first, in the middle, and filtered by an id prefix.

    .venv/bin/python bench/pages.py [--streams 10000] [--requests 30]

The streams are written straight into a SQLite database (as a server restarted with them would
find them: bench/fleet.py does the same), a real `twinwatch serve` starts on them, and each
stream gets one reading so that it has a live position; then each kind of page is asked for
`--requests` times, one request at a time, and the median and the slowest are printed.
"""

from __future__ import annotations

import argparse
import base64
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import serve, stop, stream_rows  # (a script beside this one)

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


if __name__ == "__main__":
    main()
