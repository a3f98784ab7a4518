"""A gateway back after a silence: 1,000 streams silent past their stale limit, then the tick
that brings their next readings (and closes their `stale` alarms), against a tick without a
pause before it.

    .venv/bin/python bench/silence.py [--streams 1000] [--rounds 4] [--pause 4]
        [--trees /tmp/base,.]

Each tree (a checkout: `git worktree add /tmp/base <commit>` for the one before a change) gets
a `twinwatch serve` of its own, on a fresh PostgreSQL schema, with the streams of the stateful
LSTM (bench/harness.py) warmed up through it; both run at once and take turns, round by round.
A round: five ticks 100 ms apart, then `--pause` seconds of silence (the stale limit is 10
periods, 1 s at 10 Hz, and the server's timer opens the alarms meanwhile), then the tick after
it and the one after that. Printed: each tick's time to answer and how many alarms it closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from harness import (
    DEFAULT_POSTGRES,
    Connection,
    Server,
    postgres_schema,
    stateful_model,
    twinwatch_server,
)
from ingest import series_values
from streams import MULTI_PATH, WARMUP_EXTRA, create_streams, model_window, multi_body, warm_up


class Tree:
    """One checkout's server, its streams, and where they stand."""

    def __init__(self, server: Server, names: list[str], values: np.ndarray, base_ms: int):
        self.server = server
        self.names = names
        self.values = values
        self.offsets = (np.arange(len(names)) * 13) % (len(values) // 2)
        self.base_ms = base_ms
        self.sample = 0
        self.normal: list[float] = []
        self.after: list[tuple[float, int]] = []

    async def tick(self) -> tuple[float, int]:
        """One reading for every stream, in one request: seconds to answer, alarms closed."""
        rows = self.offsets + self.sample
        items = [
            (n, self.sample, self.values[r : r + 1]) for n, r in zip(self.names, rows, strict=True)
        ]
        connection = Connection(self.server.port)
        try:
            started = time.perf_counter()
            status, answer = await connection.request(
                "POST", MULTI_PATH + "?results=false", multi_body(items, self.base_ms)
            )
            took = time.perf_counter() - started
        finally:
            await connection.close()
        if status != 200:
            raise RuntimeError(f"{status}: {answer[:300]!r}")
        self.sample += 1
        closed = sum(len(stream["closed"]) for stream in json.loads(answer)["streams"])
        return took, closed


def prepare(tree: Path, name: str, work: Path, url: str, model: str, streams: int) -> Tree:
    server = twinwatch_server(
        name,
        database_url=url,
        models_dir=work / "models",
        work=work,
        log_level="warning",
        default_model=model,
    )
    server.cwd = tree  # (its `app` is the tree's)
    server.env["TWINWATCH_STALE_MIN_S"] = "0"  # the limit is 10 periods, not the 30 s default
    server.launch()
    server.wait_ready("/readyz")
    names = [f"gateway-{i:05d}" for i in range(streams)]
    asyncio.run(create_streams(server.port, names, model))
    warm = asyncio.run(model_window(server.port, names[0])) + WARMUP_EXTRA
    values = series_values(20_000)
    base_ms = int(time.time() * 1000) - 100 * (warm + 1_000)
    prepared = Tree(server, names, values, base_ms)
    asyncio.run(warm_up(server.port, names, values, prepared.offsets, warm, base_ms, multi=True))
    prepared.sample = warm
    return prepared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pause", type=float, default=4.0)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    args = parser.parse_args()
    paths = [Path(p).resolve() for p in args.trees.split(",")]
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="twinwatch-silence-")))
        model, _ = stateful_model(work / "models")
        trees = []
        for index, path in enumerate(paths):
            url = stack.enter_context(postgres_schema(args.postgres_url))
            tree = prepare(path, f"tree-{index}", work, url, model, args.streams)
            stack.callback(tree.server.stop)
            trees.append(tree)
        for round_ in range(args.rounds):
            for tree in trees if round_ % 2 == 0 else reversed(trees):
                for _ in range(5):
                    tree.normal.append(asyncio.run(tree.tick())[0])
                    time.sleep(0.1)
                time.sleep(args.pause)
                tree.after.append(asyncio.run(tree.tick()))
                tree.normal.append(asyncio.run(tree.tick())[0])
        for path, tree in zip(paths, trees, strict=True):
            after = ", ".join(f"{1000 * s:.0f} ms ({closed})" for s, closed in tree.after)
            print(f"{path}:")
            print(f"  a tick, median: {1000 * statistics.median(tree.normal):.0f} ms")
            print(f"  the tick after the silence (alarms it closed): {after}")
            per_alarm = [s / closed for s, closed in tree.after if closed]
            if per_alarm:
                print(f"  per alarm closed, median: {1000 * statistics.median(per_alarm):.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
