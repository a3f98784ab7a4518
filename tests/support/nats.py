"""A NATS server with JetStream of a test's own: Debian's `nats-server` on a free port, its
store in a directory of the test; stopped (or killed, or restarted) by the test."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

NATS_SERVER = shutil.which("nats-server")
READY_LIMIT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def started(command: list[str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """A server process, once it listens on `port` (its output appended to `log_path`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_LIMIT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{command[0]} did not start: see {log_path}") from None
            time.sleep(0.05)


class LocalServer:
    """A server process of the test's own, on a free loopback port: `command()` starts it."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        assert self.process is None
        command = self.command()
        self.process = started(command, self.port, self.directory / f"{Path(command[0]).name}.log")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)
            self.process = None


S = TypeVar("S", bound=LocalServer)


@contextmanager
def running(server: S) -> Iterator[S]:
    """The server started, and killed at the end."""
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


class NatsServer(LocalServer):
    def __init__(self, directory: Path) -> None:
        if NATS_SERVER is None:
            pytest.skip("nats-server is not installed (apt-get install nats-server)")
        self.directory = directory
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        assert NATS_SERVER is not None
        store = str(self.directory / "store")
        return [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", store]


def nats_server(directory: Path) -> AbstractContextManager[NatsServer]:
    return running(NatsServer(directory))
