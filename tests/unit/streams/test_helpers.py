"""The helper pool runs work on its own threads, kept off the CPU of the thread that submits."""

from __future__ import annotations

import os
import threading

import pytest

from app.streams.helpers import HelperPool, _cpu_reader


def test_work_runs_on_a_helper_thread_and_its_result_comes_back() -> None:
    pool = HelperPool()
    ran_on = pool.submit(threading.current_thread).result()
    assert ran_on is not threading.current_thread()
    assert ran_on.name.startswith("twinwatch-helper")
    with pytest.raises(ZeroDivisionError):  # its error is the caller's to see
        pool.submit(lambda: 1 / 0).result()


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and at least two CPUs",
)
def test_helpers_are_kept_off_the_cpu_the_caller_runs_on() -> None:
    assert _cpu_reader() is not None
    everywhere = os.sched_getaffinity(0)
    pool = HelperPool()
    helper = pool.submit(threading.get_native_id).result()  # the thread now exists
    try:
        for cpu in sorted(everywhere)[:2]:
            os.sched_setaffinity(0, {cpu})  # the caller (this thread) on one CPU
            pool.submit(lambda: None).result()
            assert os.sched_getaffinity(helper) == everywhere - {cpu}
    finally:
        os.sched_setaffinity(0, everywhere)
