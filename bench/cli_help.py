"""How long `twinwatch --help` and a command's own help take to print, beside the Python
interpreter starting and doing nothing (the floor), taken in turns.

    .venv/bin/python bench/cli_help.py [--rounds 10]

Each round runs, in turn: `python -c pass`, `twinwatch --help`, `twinwatch serve --help`,
`twinwatch evaluate benchmark --help`; printed: each one's median and spread of wall times.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

RUNS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "twinwatch --help": [sys.executable, "-c", "from app.cli import main; main()", "--help"],
    "twinwatch serve --help": [
        *(sys.executable, "-c", "from app.cli import main; main()"),
        *("serve", "--help"),
    ],
    "twinwatch evaluate benchmark --help": [
        *(sys.executable, "-c", "from app.cli import main; main()"),
        *("evaluate", "benchmark", "--help"),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    took: dict[str, list[float]] = {name: [] for name in RUNS}
    for _ in range(rounds):
        for name, command in RUNS.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            took[name].append(time.perf_counter() - start)
    for name, times in took.items():
        print(
            f"{name:38} median {statistics.median(times):.3f} s "
            f"(min {min(times):.3f}, max {max(times):.3f}, {rounds} runs)"
        )


if __name__ == "__main__":
    main()
