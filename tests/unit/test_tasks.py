"""The lifecycle kit: guarded tasks and threads are never silently gone, stops are bounded,
and the worker runs one bounded blocking call at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import pytest

from ate_devplugin.tasks import Guard, TaskDiedError, Worker, WorkerBusyError, cancel, stop_all
from tests.unit.fakes import until


class Heard:
    def __init__(self) -> None:
        self.deaths: list[tuple[str, BaseException]] = []
        self.counted: list[str] = []
        self.guard = Guard(lambda name, error: self.deaths.append((name, error)), self.counted.append)


async def test_a_task_that_raises_is_logged_counted_and_told(caplog: pytest.LogCaptureFixture) -> None:
    heard = Heard()

    async def fails() -> None:
        raise ValueError("injected")

    task = heard.guard.spawn("slice_sync", fails(), "resourceslice sync")
    await until(lambda: heard.deaths, "death told")
    assert task.get_name() == "resourceslice sync"
    ((name, error),) = heard.deaths
    assert (name, str(error), heard.counted) == ("resourceslice sync", "injected", ["slice_sync"])
    (record,) = [r for r in caplog.records if r.message == "resourceslice sync died"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None


async def test_a_task_that_returns_has_died_too() -> None:
    heard = Heard()

    async def returns() -> None:
        return None

    heard.guard.spawn("event_router", returns(), "event router")
    await until(lambda: heard.deaths, "death told")
    ((name, error),) = heard.deaths
    assert name == "event router"
    assert isinstance(error, TaskDiedError)
    assert str(error) == "event router returned"


async def test_a_cancelled_task_ends_quietly() -> None:
    heard = Heard()

    async def waits() -> None:
        await asyncio.Event().wait()

    task = heard.guard.spawn("agent", waits(), "agent ate.dev/kvm")
    await asyncio.sleep(0)
    assert await cancel(task, 1.0)
    await asyncio.sleep(0)
    assert (heard.deaths, heard.counted) == ([], [])


async def test_a_thread_tells_the_loop_of_its_end() -> None:
    heard = Heard()
    report = heard.guard.for_thread("http", "http endpoint")
    thread = threading.Thread(target=report, args=(OSError("socket closed"),))
    thread.start()
    thread.join()
    await until(lambda: heard.deaths, "death told on the loop")
    assert [(n, str(e)) for n, e in heard.deaths] == [("http endpoint", "socket closed")]
    assert heard.counted == ["http"]


async def test_cancel_ends_a_task_whose_first_cancellation_is_lost() -> None:
    lost = []

    async def loses_one() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            lost.append(1)
        await asyncio.sleep(10)

    task = asyncio.create_task(loses_one())
    await asyncio.sleep(0)
    assert await cancel(task, 5.0)
    assert lost == [1]
    assert task.cancelled()


async def test_cancel_gives_up_on_a_task_that_swallows_every_cancellation() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await released.wait()

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    begin = loop.time()
    assert not await cancel(task, 0.3)
    assert loop.time() - begin < 30  # a hang bound: the stubborn task never ends by itself
    released.set()
    await task
    assert await cancel(None, 0.0)


async def test_stop_all_names_what_is_still_running() -> None:
    async def says(stuck: list[str]) -> list[str]:
        return stuck

    async def hangs() -> list[str]:
        await asyncio.Event().wait()
        return []

    async def fails() -> list[str]:
        raise RuntimeError("injected")

    stuck = await stop_all({"a": says([]), "b": says(["agent x"]), "c": hangs(), "d": fails()}, 0.2)
    assert sorted(stuck) == ["agent x", "c"]
    assert await stop_all({}, 0.0) == []


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
