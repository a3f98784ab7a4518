"""A NATS server with JetStream of a test's own: Debian's `nats-server` on a free port, its
store in a directory of the test; stopped (or killed, or restarted) by the test."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

NATS_SERVER = shutil.which("nats-server")
READY_LIMIT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsServer:
    def __init__(self, directory: Path) -> None:
        if NATS_SERVER is None:
            pytest.skip("nats-server is not installed (apt-get install nats-server)")
        self.directory = directory
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert NATS_SERVER is not None and self.process is None
        log = (self.directory / "nats-server.log").open("ab")
        self.process = subprocess.Popen(
            [
                NATS_SERVER,
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-sd",
                str(self.directory / "store"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + READY_LIMIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not start: see {log.name}") from None
                time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)
            self.process = None


@contextmanager
def nats_server(directory: Path) -> Iterator[NatsServer]:
    server = NatsServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
