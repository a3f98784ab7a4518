"""The plain install is the service: the wheel, installed (not editable) into a fresh virtual
environment without torch, serves the shipped default model from a directory that is not the
checkout, and raises the README's alarms for the lab record.

The environment is made the way a user makes it (`python -m venv`, `pip install <wheel>`); its
dependencies come from pip's cache or the package index. torch is not among them, and the test
checks that it cannot be imported there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.monitoring.evaluation import DETECTION_MARGIN, RECOVERY
from app.series import Series, read_csv
from app.simulation.faults import LAB_FAULTS
from tests.e2e.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
LAB_CSV = ROOT / "tests" / "data" / "twin_seed0_lab_faults.csv"
STREAM = "pump-1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
BATCHES = [(a, a + 100) for a in range(6000, 7000, 100)] + [
    (a, a + 50) for a in range(7000, 8000, 50)
]
READY_LIMIT_S = 90.0

# The README's table for the default model: who alarms within [start, end + 20) of each lab
# fault, and how many samples after its start the first alarm opens.
README_CATCHES = {
    "spike": ({"point", "rolling_rms", "cusum", "level"}, 0),
    "offset": ({"point", "rolling_rms", "cusum", "level"}, 0),
    "excitation": ({"cusum", "rolling_rms", "point"}, 78),
    "stuck": ({"level", "variance_floor"}, 5),
}


def at(sample: int) -> datetime:
    return T0 + timedelta(milliseconds=100 * sample)


def sample_of(moment: str) -> int:
    return round((datetime.fromisoformat(moment) - T0).total_seconds() * 10)


def run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel of this checkout and its dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", work / "dist", ROOT)
    assert built.returncode == 0, built.stderr
    (wheel,) = (work / "dist").glob("twinwatch-*.whl")
    made = run(sys.executable, "-m", "venv", work / "venv")
    assert made.returncode == 0, made.stderr
    installed = run(work / "venv" / "bin" / "pip", "install", "--quiet", wheel)
    assert installed.returncode == 0, installed.stderr
    return work / "venv"


@pytest.fixture(scope="module")
def server(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`twinwatch serve` with every default (SQLite under ./data, the shipped models), started
    in an empty directory; yields its URL and process id."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINWATCH_", "PYTHON"))}
    port = free_port()
    log = (elsewhere / "serve.log").open("wb")
    process = subprocess.Popen(
        [venv / "bin" / "twinwatch", "serve", "--port", str(port)],
        cwd=elsewhere,
        env=env | {"TWINWATCH_LOG_LEVEL": "warning"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_LIMIT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"serve exited:\n{(elsewhere / 'serve.log').read_text()}")
            try:
                if httpx.get(f"{base}/readyz", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"serve not ready:\n{(elsewhere / 'serve.log').read_text()}")
            time.sleep(0.1)
        assert (elsewhere / "data" / "twinwatch.db").is_file()  # migrated, from the package
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_the_environment_has_no_torch(venv: Path) -> None:
    result = run(venv / "bin" / "python", "-c", "import torch")
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr


def test_the_service_needs_no_matplotlib(venv: Path) -> None:
    """Figures are the `plots` extra's: the plain install serves (above) without it, and a
    figure asked for says how to get it."""
    result = run(venv / "bin" / "python", "-c", "import matplotlib")
    assert result.returncode != 0 and "No module named 'matplotlib'" in result.stderr
    asked = run(
        venv / "bin" / "python",
        "-c",
        "from app.figures import require_matplotlib; require_matplotlib()",
    )
    assert "pip install 'twinwatch[plots]'" in asked.stderr


def test_the_lab_record_raises_the_readmes_alarms(server: tuple[str, int]) -> None:
    base, _ = server
    series: Series = read_csv(LAB_CSV)
    assert series.reference is not None
    with httpx.Client(base_url=base, timeout=60.0) as client:
        models = {model["name"] for model in client.get("/v1/models").json()["items"]}
        assert {"lstm-seed0", "lstm-day-seed3", "lstm-stateful-day-seed3"} <= models
        created = client.put(
            f"/v1/streams/{STREAM}",
            json={"model": "lstm-stateful-day-seed3", "has_reference": True},
        )
        assert created.status_code == 201, created.text
        for start, stop in BATCHES:
            readings = [
                {
                    "t": at(i).isoformat(),
                    "value": float(series.value[i]),
                    "reference": float(series.reference[i]),
                }
                for i in range(start, stop)
            ]
            answer = client.post(
                f"/v1/streams/{STREAM}/readings?results=false", json={"readings": readings}
            )
            assert answer.status_code == 200, answer.text
        alarms = client.get("/v1/alarms", params={"stream": STREAM, "limit": 500}).json()["items"]
    opened = [(sample_of(alarm["opened_at"]), alarm["detector"]) for alarm in alarms]
    for fault in LAB_FAULTS:
        detectors, delay = README_CATCHES[fault.type.value]
        caught = [(s, d) for s, d in opened if fault.start <= s < fault.end + DETECTION_MARGIN]
        assert {d for _, d in caught} == detectors, fault
        assert min(s for s, _ in caught) - fault.start == delay, fault
    false = [
        (s, d)
        for s, d in opened
        if not any(f.start <= s < f.end + DETECTION_MARGIN + RECOVERY for f in LAB_FAULTS)
    ]
    assert not false, false


def test_the_installed_package_serves_its_pages(server: tuple[str, int]) -> None:
    """The templates, the stylesheet, the chart's script and uPlot travel in the wheel."""
    base, _ = server
    for path, heading in (("/", "<h1>Streams</h1>"), ("/alarms", "<h1>Alarms</h1>")):
        page = httpx.get(f"{base}{path}", timeout=30)
        assert page.status_code == 200 and heading in page.text
    style = httpx.get(f"{base}/static/twinwatch.css", timeout=30)
    assert style.status_code == 200 and "prefers-color-scheme: dark" in style.text
    for asset, text in (
        ("stream.js", "twinwatchChart"),
        ("vendor/uplot/uPlot.iife.min.js", "uPlot"),
        ("vendor/uplot/uPlot.min.css", ".uplot"),
    ):
        answer = httpx.get(f"{base}/static/{asset}", timeout=30)
        assert answer.status_code == 200 and text in answer.text, asset
