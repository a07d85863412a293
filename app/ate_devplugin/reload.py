"""Reading the config file again, off the event loop and within a time bound."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WorkerBusyError(Exception):
    pass


class Worker:
    """Runs one blocking call at a time in a daemon thread, which never holds up exit.

    A call that outlives its timeout keeps its thread (Python cannot stop it); the next
    call is refused until it ends, so a read that hangs for ever costs one thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._finished = threading.Event()
        self._finished.set()

    async def call(self, fn: Callable[[], T], timeout: float) -> T:
        if not self._finished.is_set():
            raise WorkerBusyError(f"the previous {self.name} has not finished")
        finished = self._finished = threading.Event()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, exc: BaseException | None) -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)  # type: ignore[arg-type]  # None only with exc

        def work() -> None:
            try:
                result, exc = fn(), None
            except BaseException as e:  # handed to the loop, which re-raises it
                result, exc = None, e
            finished.set()  # before the result arrives: the next call may start at once
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, result, exc)

        threading.Thread(target=work, name=self.name, daemon=True).start()
        done, _ = await asyncio.wait({future}, timeout=timeout)
        if not done:
            future.cancel()
            raise TimeoutError(f"{self.name} did not finish within {timeout:.1f}s")
        return future.result()
