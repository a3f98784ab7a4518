"""Ingest latency with and without a training job running, side by side in one run.

    .venv/bin/python bench/job_ingest.py [--streams 100] [--phase-s 30] [--rounds 2]
        [--job retrain|relearn]

A real `twinwatch serve` (SQLite in a temporary directory, the shipped window LSTM
`lstm-seed0`) gets `--streams` streams with the first 6,000 readings of the twin's record each
(its 8,000 are read round after that). Then phases alternate: idle, then while a retrain job
(of the first stream, many epochs) trains; in every phase one client posts a reading to each
stream in turn, one request each, and the latency of each request is recorded. The job is
cancelled at the end of its phase. p50 and p99 per kind of phase, over all rounds.

With `--job relearn` the job is a scheduled relearning instead: one more stream, of model
"auto", learns from its first 1,000 readings of `--history` (the twin's record over and over,
one reading every 0.1 s), and its relearning schedule comes due at the start of each training
phase, on that history (the LSTM offered, as the service does by default); its requests are
not measured, and a training phase lasts while the job runs (at most `--phase-s`).
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
LEARNER = "learner"
LEARNER_CHUNK = 5_000


def phase(
    client: httpx.Client,
    streams: int,
    values: np.ndarray,
    sample: int,
    seconds: float,
    job: int | None = None,
) -> tuple[list[float], int]:
    """Post one reading to each stream in turn for `seconds` (and while `job` runs): each
    request's latency (s)."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop and (job is None or _running(client, job)):
        for i in range(streams):
            value = float(values[sample % len(values)])
            body = {"readings": [{"t": T0 + 0.1 * sample, "value": value}]}
            started = time.perf_counter()
            answer = client.post(f"/v1/streams/s{i}/readings?results=false", json=body)
            latencies.append(time.perf_counter() - started)
            answer.raise_for_status()
        sample += 1
    return latencies, sample


def _running(client: httpx.Client, job: int) -> bool:
    return bool(client.get(f"/v1/jobs/{job}").json()["phase"] == "running")


def _feed_learner(client: httpx.Client, values: np.ndarray, first: int, stop: int) -> None:
    for start in range(first, stop, LEARNER_CHUNK):
        readings = [
            {"t": T0 + 0.1 * k, "value": float(values[k % len(values)])}
            for k in range(start, min(stop, start + LEARNER_CHUNK))
        ]
        client.post(
            f"/v1/streams/{LEARNER}/readings?results=false", json={"readings": readings}
        ).raise_for_status()


def _relearning(client: httpx.Client, values: np.ndarray, fed: int, due: int) -> tuple[int, int]:
    """The learner's readings up to its relearning at reading `due`: the job, once it runs."""
    _feed_learner(client, values, fed, due + 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        jobs = client.get("/v1/jobs", params={"stream": LEARNER}).json()["items"]
        running = [j for j in jobs if j["kind"] == "relearn" and j["phase"] == "running"]
        if running:
            return int(running[0]["id"]), due + 1
        time.sleep(0.2)
    # (a relearning that finished within its phase left a candidate proving: no other runs)
    raise SystemExit("no relearning ran: give a longer --history, so each outlasts its phase")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--job", choices=("retrain", "relearn"), default="retrain")
    parser.add_argument(
        "--history", type=int, default=300_000, help="the learner's readings (relearn)"
    )
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
                fed = 0
                if args.job == "relearn":  # due at the history's end, then 10 s on each round
                    due = [args.history + 100 * r for r in range(args.rounds)]
                    relearn = {"after_s": [0.1 * d for d in due], "every_s": None}
                    client.put(
                        f"/v1/streams/{LEARNER}",
                        json={"model": "auto", "learning": {"readings": 1000, "relearn": relearn}},
                    ).raise_for_status()
                    _feed_learner(client, values, 0, args.history)
                    fed = args.history
                sample = HISTORY
                measured: dict[str, list[float]] = {"idle": [], "training": []}
                for r in range(args.rounds):
                    latencies, sample = phase(client, args.streams, values, sample, args.phase_s)
                    measured["idle"] += latencies
                    if args.job == "relearn":
                        job_id, fed = _relearning(client, values, fed, due[r])
                    else:
                        job_id = client.post(
                            "/v1/streams/s0/jobs", json={"kind": "retrain", "epochs": 1000}
                        ).json()["id"]
                        while (
                            client.get(f"/v1/jobs/{job_id}").json()["progress"].get("step")
                            != "training"
                        ):
                            time.sleep(0.2)
                    latencies, sample = phase(
                        client, args.streams, values, sample, args.phase_s, job_id
                    )
                    measured["training"] += latencies
                    if _running(client, job_id):
                        client.delete(f"/v1/jobs/{job_id}").raise_for_status()
                    time.sleep(1)
            print(
                f"{args.streams} streams of {MODEL}, one reading a request, {args.rounds} rounds "
                f"of {args.phase_s:.0f} s idle then up to {args.phase_s:.0f} s while a "
                f"{args.job} job runs"
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
