"""`twinwatch serve` as a real process: it migrates a fresh database, serves, and stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

STARTUP_LIMIT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(tmp_path: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`twinwatch serve` on a fresh data directory, with `TWINWATCH_*` variables from `env`."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TWINWATCH_")}
    environment |= {
        "TWINWATCH_DATA_DIR": str(tmp_path / "data"),
        "TWINWATCH_MODELS_DIR": str(tmp_path / "no-models"),
        "TWINWATCH_SHIPPED_MODELS": "false",
        "TWINWATCH_DEFAULT_MODEL": "lstm-seed0",
        "TWINWATCH_LOG_LEVEL": "info",
        **{f"TWINWATCH_{name.upper()}": value for name, value in env.items()},
    }
    process = subprocess.Popen(
        [sys.executable, "-c", "from app.cli import main; main()", "serve", "--port", str(port)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_LIMIT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"serve exited early:\n{process.stdout.read() if process.stdout else ''}"
                )
            try:
                httpx.get(f"{base}/healthz", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    pytest.fail("serve did not start listening")
                time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    with serving(tmp_path) as (base, process):
        yield base, process, tmp_path


def test_serve_starts_on_a_fresh_data_dir_and_stops_on_sigterm(
    server: tuple[str, subprocess.Popen[str], Path],
) -> None:
    base, process, tmp_path = server
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert (tmp_path / "data" / "twinwatch.db").is_file()  # created and migrated on start
    ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 503  # no model artifacts
    assert "default model 'lstm-seed0' not loaded" in ready.json()["detail"]
    assert httpx.put(f"{base}/v1/streams/pump-1", json={}).status_code == 422
    assert httpx.get(f"{base}/v1/streams").json() == {"items": [], "next_cursor": None}

    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    # uvicorn shuts down gracefully (the lifespan closes the database), then re-raises SIGTERM.
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in output


def test_serve_logs_json_lines_uvicorn_included_with_the_request_id(tmp_path: Path) -> None:
    with serving(tmp_path, log_format="json") as (base, process):
        response = httpx.get(f"{base}/healthz", headers={"X-Request-ID": "e2e-7"})
        assert response.headers["X-Request-ID"] == "e2e-7"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    lines = [json.loads(line) for line in output.splitlines()]  # every line, or it fails here
    by_logger = {line["logger"] for line in lines}
    assert {"uvicorn.error", "uvicorn.access", "app.registry"} <= by_logger
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert all("request_id" in line for line in access)  # the start-up polls got one made
    (ours,) = [line for line in access if line["request_id"] == "e2e-7"]
    assert '"GET /healthz HTTP/1.1" 200' in ours["message"]
    assert any(line["message"] == "Application shutdown complete." for line in lines)
