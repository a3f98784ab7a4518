"""Waiting in tests for what a service does in its own threads, with a limit that fails the
test rather than hanging it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: Callable[[], T], message: str, timeout_s: float = 120) -> T:
    """`what()` once it is truthy; fails with `message` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, message
        time.sleep(0.05)
