"""A helper thread for work that can run beside the request's own thread.

A long batch's forecasts run in the request's thread while a helper checks the batch's times
(see `StreamEngine._validate`): the LSTM releases the GIL, so the two overlap only if they are
on different CPUs. Linux often wakes a thread on the CPU of the thread that woke it; the helper
then waits behind the forecasts while the other CPU idles (measured with 1,000-reading batches
on this project's 2-CPU machine: 60% of requests ran that way). So before each hand-off the
helpers are kept off the CPU the caller is on (a system call only when the caller has moved).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def _cpu_reader() -> Callable[[], int] | None:
    """The CPU the calling thread runs on (the C library's `sched_getcpu`), if there is one."""
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return function


class HelperPool:
    """A small thread pool whose threads stay off the CPU of whoever submits to them."""

    def __init__(self, workers: int = 2) -> None:
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix="twinwatch-helper", initializer=self._register
        )
        self._lock = threading.Lock()
        self._threads: list[int] = []  # native ids of the pool's threads
        self._placed_off: int | None = None  # the CPU they were last kept off
        self._current_cpu = _cpu_reader()
        self._cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()

    def _register(self) -> None:
        with self._lock:
            self._threads.append(threading.get_native_id())
            self._placed_off = None  # place the new thread at the next hand-off

    def submit(self, function: Callable[[], T]) -> Future[T]:
        """Run `function` on a helper (RuntimeError once the interpreter is shutting down)."""
        self._keep_off_caller_cpu()
        return self._executor.submit(function)

    def _keep_off_caller_cpu(self) -> None:
        if self._current_cpu is None or len(self._cpus) < 2:
            return
        cpu = self._current_cpu()
        with self._lock:
            if cpu == self._placed_off or cpu not in self._cpus:
                return
            others = self._cpus - {cpu}
            try:
                for thread in self._threads:
                    os.sched_setaffinity(thread, others)
            except OSError:  # a sandbox may forbid it: placement is only an optimisation
                self._current_cpu = None
                return
            self._placed_off = cpu


_pool_lock = threading.Lock()
_pool: HelperPool | None = None


def helper_pool() -> HelperPool:
    """The process's helper pool, created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = HelperPool()
        return _pool
