"""Ingest latency with and without a training job running, side by side in one run.

    .venv/bin/python bench/job_ingest.py [--streams 100] [--phase-s 30] [--rounds 2]

A real `twinwatch serve` (SQLite in a temporary directory, the shipped window LSTM
`lstm-seed0`) gets `--streams` streams with the first 6,000 readings of the twin's record each
(its 8,000 are read round after that). Then phases alternate: idle, then while a retrain job
(of the first stream, many epochs) trains; in every phase one client posts a reading to each
stream in turn, one request each, and the latency of each request is recorded. The job is
cancelled at the end of its phase. p50 and p99 per kind of phase, over all rounds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from harness import twinwatch_server

from app.series import read_csv

MODEL = "lstm-seed0"
T0 = 1.7e9
HISTORY = 6_000


def phase(
    client: httpx.Client, streams: int, values: np.ndarray, sample: int, seconds: float
) -> tuple[list[float], int]:
    """Post one reading to each stream in turn for `seconds`: each request's latency (s)."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for i in range(streams):
            value = float(values[sample % len(values)])
            body = {"readings": [{"t": T0 + 0.1 * sample, "value": value}]}
            started = time.perf_counter()
            answer = client.post(f"/v1/streams/s{i}/readings?results=false", json=body)
            latencies.append(time.perf_counter() - started)
            answer.raise_for_status()
        sample += 1
    return latencies, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    values = read_csv(Path("tests/data/twin_seed0.csv")).value
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "no-models").mkdir()  # the shipped models only
        server = twinwatch_server(
            "job-ingest",
            database_url=f"sqlite:///{work / 'twinwatch.db'}",
            models_dir=work / "no-models",
            work=work,
            log_level="warning",
        )
        server.env["TWINWATCH_STALE_PERIODS"] = "0"
        server.launch()
        server.wait_ready("/readyz", limit_s=300)
        base = f"http://127.0.0.1:{server.port}"
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                for i in range(args.streams):
                    client.put(f"/v1/streams/s{i}", json={"model": MODEL}).raise_for_status()
                    readings = [
                        {"t": T0 + 0.1 * k, "value": float(values[k])} for k in range(HISTORY)
                    ]
                    client.post(
                        f"/v1/streams/s{i}/readings?results=false", json={"readings": readings}
                    ).raise_for_status()
                sample = HISTORY
                measured: dict[str, list[float]] = {"idle": [], "training": []}
                for _ in range(args.rounds):
                    latencies, sample = phase(client, args.streams, values, sample, args.phase_s)
                    measured["idle"] += latencies
                    job = client.post(
                        "/v1/streams/s0/jobs", json={"kind": "retrain", "epochs": 1000}
                    ).json()
                    while (
                        client.get(f"/v1/jobs/{job['id']}").json()["progress"].get("step")
                        != "training"
                    ):
                        time.sleep(0.2)
                    latencies, sample = phase(client, args.streams, values, sample, args.phase_s)
                    measured["training"] += latencies
                    client.delete(f"/v1/jobs/{job['id']}").raise_for_status()
                    time.sleep(1)
            print(
                f"{args.streams} streams of {MODEL}, one reading a request, {args.rounds} rounds "
                f"of {args.phase_s:.0f} s idle then {args.phase_s:.0f} s while a retrain job trains"
            )
            for name, latencies in measured.items():
                ms = np.array(latencies) * 1e3
                print(
                    f"{name:>9}: {ms.size:6d} requests, p50 {np.percentile(ms, 50):.2f} ms, "
                    f"p99 {np.percentile(ms, 99):.2f} ms"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
