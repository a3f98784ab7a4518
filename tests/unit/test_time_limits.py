"""The suite's own time limits fire however a test is stuck: a test that swallows
pytest-timeout's exception (as an event loop cancelling its tasks can) still ends the run, with
every thread's stack, when the faulthandler's limit passes (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUCK = """
import time

def test_stuck():
    while True:
        try:
            time.sleep(100)
        except BaseException:
            pass  # pytest-timeout's failure, swallowed
"""


def test_a_test_that_swallows_its_timeout_still_ends_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    command = [
        *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
        *("-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)),
        *("-o", "timeout=1", "-o", "faulthandler_timeout=3", "test_stuck.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Timeout (0:00:03)!" in done.stderr and "test_stuck.py" in done.stderr, done.stderr
