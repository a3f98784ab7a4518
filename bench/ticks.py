"""CPU of one gateway tick (one new reading for each of N streams) processed in-process, for
streams of the twin's shipped model and for streams that learned their own (model auto), in the
same run, alternately.

    .venv/bin/python bench/ticks.py [--streams 500]

Streams of one shipped model share one recurrence and step together; each learned stream has a
recurrence of its own. The tick runs through `ingest` in a committed transaction (SQLite in a
temporary directory), as the HTTP handler runs it; thread CPU time, best of 5 rounds of 10.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.schemas import ReadingIn
from app.series import read_csv
from app.service.readings import new_readings
from app.settings import Settings
from app.streams.ingest import ingest

T0 = 1.7e9
WARM = 300


class Fleet:
    def __init__(self, count: int, stream: dict[str, Any]) -> None:
        self.series = read_csv(Path("tests/data/twin_seed0.csv"))
        directory = Path(tempfile.mkdtemp())
        self.client = TestClient(create_app(Settings(data_dir=directory, stale_periods=0)))
        self.client.__enter__()
        self.state = self.client.app_state["twinwatch"]
        self.count = count
        for i in range(count):
            self.client.put(f"/v1/streams/s{i}", json=stream)
        body = [
            {
                "stream": f"s{i}",
                "readings": [{"t": T0 + 0.1 * k, "value": self.value(i, k)} for k in range(WARM)],
            }
            for i in range(count)
        ]
        for j in range(0, count, 20):
            answer = self.client.post(
                "/v1/readings?results=false", json={"streams": body[j : j + 20]}
            )
            assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 300
        while any(
            self.client.get(f"/v1/streams/s{i}").json()["phase"] != "monitoring"
            for i in range(0, count, max(1, count // 10))
        ):
            assert time.monotonic() < deadline, "the streams did not learn"
            time.sleep(0.2)
        self.k = WARM

    def value(self, stream: int, k: int) -> float:
        return float(self.series.value[(k + 7 * stream) % len(self.series.value)])

    def tick(self) -> None:
        at = datetime.fromtimestamp(T0, UTC) + timedelta(milliseconds=100 * self.k)
        items = [
            (f"s{n}", [ReadingIn(t=at, value=self.value(n, self.k))]) for n in range(self.count)
        ]
        self.k += 1
        with self.state.database.session() as session:
            ingest(
                session,
                self.state.streams,
                self.state.metrics,
                new_readings(items),
                max_future_s=1e9,
            )

    def cpu_per_tick(self) -> float:
        started = time.thread_time()
        for _ in range(10):
            self.tick()
        return (time.thread_time() - started) / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500)
    args = parser.parse_args()
    fleets = {
        "shipped model": Fleet(args.streams, {"model": "lstm-stateful-day-seed3"}),
        "learned (auto)": Fleet(args.streams, {"learning": {"readings": 200}}),
    }
    gc.collect()
    gc.freeze()
    best = dict.fromkeys(fleets, 1e9)
    for fleet in fleets.values():
        fleet.cpu_per_tick()  # warm
    for _ in range(5):
        for name, fleet in fleets.items():
            best[name] = min(best[name], fleet.cpu_per_tick())
    for name, seconds in best.items():
        print(
            f"{name:15s} tick of {args.streams}: CPU {seconds * 1e3:.1f} ms "
            f"({seconds * 1e6 / args.streams:.0f} us a stream)"
        )


if __name__ == "__main__":
    main()
