"""The worker thread that reads the config: bounded, one call at a time."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ate_devplugin.tasks import Worker, WorkerBusyError


async def test_calls_in_a_row_each_run() -> None:
    worker = Worker("test read")
    for _ in range(50):  # each call may start the moment the previous result is in
        assert await worker.call(lambda: 7, timeout=5) == 7


async def test_an_error_is_raised_on_the_loop() -> None:
    def fails() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await Worker("test read").call(fails, timeout=5)


async def test_a_call_that_outlives_its_timeout_holds_the_worker_until_it_ends() -> None:
    worker = Worker("test read")
    release = threading.Event()
    with pytest.raises(TimeoutError, match="test read did not finish"):
        await worker.call(release.wait, timeout=0.05)
    with pytest.raises(WorkerBusyError):
        await worker.call(lambda: 1, timeout=5)
    release.set()
    while True:  # the hanging call ends in its thread; then the worker takes calls again
        try:
            assert await worker.call(lambda: 2, timeout=5) == 2
            break
        except WorkerBusyError:
            await asyncio.sleep(0.01)
