"""The lifecycle kit: every long-running task is started guarded and stopped within a bound.

* :class:`Guard` starts a named task (or hears of a thread) whose unexpected end, an
  exception or returning at all, is logged, counted (``ate_devplugin_task_failures_total``)
  and told to the supervisor, which then stops the daemon with exit 1 so that the
  DaemonSet starts it afresh: nothing dies silently.
* :func:`cancel` cancels a task until it ends, within a deadline; :func:`stop_all` stops
  several things at once within one.
* :class:`Worker` runs one blocking call at a time in a thread, within a timeout.
* :class:`Backoff`: the delays between retries of something that keeps failing.
* :class:`Watchdog`: says when a step of work takes longer than it may.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class TaskDiedError(RuntimeError):
    pass


@dataclass(frozen=True)
class Guard:
    """``on_death(name, error)`` hears of every guarded task that ended unexpectedly;
    ``count(kind)`` counts it (kinds are few and fixed: they label a metric)."""

    on_death: Callable[[str, BaseException], None]
    count: Callable[[str], None] = lambda kind: None

    def spawn(self, kind: str, coro: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
        """Starts ``coro`` as a task named ``name`` (default: ``kind``). Only a cancellation ends it quietly."""
        task = asyncio.create_task(coro, name=name or kind)

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                self.died(kind, task.get_name(), task.exception())

        task.add_done_callback(ended)
        return task

    def died(self, kind: str, name: str, error: BaseException | None) -> None:
        error = error or TaskDiedError(f"{name} returned")
        log.error("%s died", name, exc_info=error)
        self.count(kind)
        self.on_death(name, error)

    def for_thread(self, kind: str, name: str) -> Callable[[BaseException], None]:
        """What a thread calls with the error that ends it: handed to the running loop."""
        loop = asyncio.get_running_loop()

        def report(error: BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the daemon is gone
                loop.call_soon_threadsafe(self.died, kind, name, error)

        return report


async def cancel(task: asyncio.Task[Any] | None, deadline_s: float) -> bool:
    """Cancels ``task`` until it ends, within ``deadline_s``; False when it did not end.

    Cancelled again and again: a cancellation can be lost (Python 3.11's wait_for drops one
    landing in the step its result arrives), and asyncio.wait never swallows ours.
    """
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.1, max(0.0, deadline - loop.time())))
    return task.done()


async def stop_all(stops: Mapping[str, Coroutine[Any, Any, list[str]]], deadline_s: float) -> list[str]:
    """Runs every named stop at once, within ``deadline_s``. Returns what is still running:
    what each stop said is, and the names of the stops not done in time."""
    futures = {asyncio.ensure_future(stop): name for name, stop in stops.items()}
    if not futures:
        return []
    done, pending = await asyncio.wait(futures, timeout=deadline_s)
    stuck = []
    for future in done:
        if future.exception() is not None:
            log.error("%s did not stop cleanly", futures[future], exc_info=future.exception())
        else:
            stuck += future.result()
    return stuck + [futures[f] for f in pending]


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


class Backoff:
    """Capped exponential backoff with jitter: each delay is drawn from [d/2, d]."""

    def __init__(self, initial: float, cap: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.cap = cap
        self._rng = rng or random.Random()
        self._next = initial

    def next(self) -> float:
        d = self._next
        self._next = min(self.cap, d * 2)
        return d / 2 + self._rng.random() * d / 2

    def reset(self) -> None:
        self._next = self.initial


class Watchdog:
    """Notices work that outlives ``deadline_s``: ``on_stall(work)`` is called once it has,
    and :attr:`stuck` says so until that work ends."""

    def __init__(self, name: str, deadline_s: float, on_stall: Callable[[object], None]) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self._on_stall = on_stall
        self.stuck: str | None = None

    @contextlib.contextmanager
    def watching(self, work: object) -> Iterator[None]:
        handle = asyncio.get_running_loop().call_later(self.deadline_s, self._stalled, work)
        try:
            yield
        finally:
            handle.cancel()
            self.stuck = None

    def liveness(self) -> tuple[bool, str]:
        return self.stuck is None, self.stuck or ""

    def _stalled(self, work: object) -> None:
        self.stuck = f"{self.name}: stuck for over {self.deadline_s:.0f}s"
        self._on_stall(work)
