"""The README's quick start ("Your own sensor, start to finish") as written: its commands, in
order, on a CSV of a pump's own sensors whose level shifts and stays shifted after learning.
`twinwatch serve` runs with the environment the line gives it (on a free port); `twinwatch`
commands run as a user types them (TWINWATCH_URL pointing at it); Prometheus runs the config
file the line names, its intervals compressed (tests/support/prometheus.py). The shift must be
one open incident, listed by the CLI, and a firing TwinwatchAlarmActive alert for the stream;
every metric the Grafana dashboard reads must be on the service's /metrics.

Needs `prometheus` on PATH (CI installs it); skipped otherwise. The venv line is not run: the
test runs in the project's own environment."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import ROOT, as_a_user_runs_it, free_port
from tests.support.prometheus import compressed_config, query

STREAM = "my-pump"
LEARNING = 1000
SHIFT = 1100  # the level moves here and stays
ROWS = 1400

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (Debian package prometheus); CI installs it",
)


def quick_start() -> list[str]:
    """The quick start's command lines, comments dropped."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Your own sensor, start to finish")
    (block,) = re.findall(r"```sh\n(.*?)```", text[start : text.index("\n## ", start + 5)], re.S)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def pump_csv(path: Path) -> None:
    """Flow and pressure once a second, correlated, about their set points; from SHIFT on the
    flow sits 5 of its spreads higher."""
    rng = np.random.default_rng(12)
    common = np.zeros(ROWS)
    for t in range(1, ROWS):
        common[t] = 0.6 * common[t - 1] + rng.normal(0, 1)
    flow = 30 + common + rng.normal(0, 0.3, ROWS)
    pressure = 5 + 0.2 * common + rng.normal(0, 0.05, ROWS)
    flow[SHIFT:] += 5 * float(np.std(flow[:LEARNING]))
    lines = ["time,flow,pressure"] + [
        f"{1_767_225_600 + i},{flow[i]:.4f},{pressure[i]:.4f}" for i in range(ROWS)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)


def test_the_quick_start_as_written(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    lines = quick_start()
    assert lines[0].startswith("python3.11 -m venv") and lines[1].startswith("export PATH")
    serve, send, listing, prometheus = lines[2:]
    pump_csv(tmp_path / "my-pump.csv")

    # twinwatch serve, with the environment its line sets, in the background.
    words = shlex.split(serve.rstrip("&").strip())
    environment = dict(word.split("=", 1) for word in words if "=" in word and word[0] != "-")
    assert words[len(environment) :] == ["twinwatch", "serve"], serve
    server = as_a_user_runs_it("quick-start", tmp_path)
    server.env |= environment
    server.start()
    try:
        user = server.env | {"TWINWATCH_URL": server.base_url, "COLUMNS": "200"}
        twinwatch = [sys.executable, "-c", "from app.cli import main; main()"]

        def run(line: str) -> str:
            command = shlex.split(line)
            assert command[0] == "twinwatch", line
            done = subprocess.run(
                [*twinwatch, *command[1:]],
                cwd=tmp_path,
                env=user,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            return " ".join("".join(c if c.isascii() else " " for c in done.stdout).split())

        said = run(send)
        assert f"{ROWS:,} readings accepted" in said, said
        deadline = time.monotonic() + 120
        while not httpx.get(f"{server.base_url}/v1/streams/{STREAM}").json().get("learned_model"):
            assert time.monotonic() < deadline, "the stream did not learn"
            time.sleep(0.2)
        # The shift: one incident, open while it lasts, listed by the CLI.
        incidents = httpx.get(f"{server.base_url}/v1/incidents", params={"stream": STREAM}).json()[
            "items"
        ]
        during = [i for i in incidents if i["opened_sample"] >= SHIFT]
        assert [i["state"] for i in during] == ["open"], incidents
        assert SHIFT <= during[0]["opened_sample"] < SHIFT + 20
        listed = run(listing)
        assert f"{during[0]['id']} {STREAM}" in listed and "open" in listed, listed

        # Prometheus, with the config file its line names, time compressed, at the test's port.
        (flag,) = [word for word in shlex.split(prometheus) if word.startswith("--config.file=")]
        source = Path(flag.split("=", 1)[1])
        assert (ROOT / source).exists(), source
        config = compressed_config(tmp_path, f"127.0.0.1:{server.port}", source=source.name)
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        processes.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        firing: list[dict[str, object]] = []
        while not firing:
            assert time.monotonic() < deadline, (
                query(url, "up"),
                query(url, "twinwatch_alarm_active"),
                query(url, "ALERTS"),
            )
            time.sleep(0.5)
            try:
                alerts = query(url, f'ALERTS{{alertname="TwinwatchAlarmActive",stream="{STREAM}"}}')
            except httpx.TransportError:
                continue
            firing = [alert for alert in alerts if alert["metric"]["alertstate"] == "firing"]

        # Every metric the Grafana dashboard reads is on /metrics.
        dashboard = json.loads((ROOT / "deploy/grafana/dashboards/twinwatch.json").read_text())
        expressions = re.findall(r'"expr": "([^"]*(?:\\"[^"]*)*)"', json.dumps(dashboard))
        wanted = {
            name
            for expression in expressions
            for name in re.findall(r"\b(twinwatch_[a-z_]+)", expression)
        }
        exported = httpx.get(f"{server.base_url}/metrics").text
        assert wanted and all(name in exported for name in wanted), sorted(
            name for name in wanted if name not in exported
        )
    finally:
        server.kill()
