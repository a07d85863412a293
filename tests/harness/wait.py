"""Waiting for a positive signal: one loop, a generous timeout, and a message that says what."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.02) -> T:
    """Calls ``check`` until it returns something truthy, and returns that.

    After ``timeout`` seconds raises TimeoutError naming ``what`` (a text, or a function
    called then, to describe the state reached). ``check`` may raise to give up early,
    e.g. when the process it waits for has died.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what() if callable(what) else what}: not within {timeout}s")
        time.sleep(interval)


def holds_for(check: Callable[[], object], seconds: float, what: str, interval: float = 0.25) -> None:
    """Asserts that ``check`` stays true for ``seconds``: a state held through a fault of
    that length (the fault's duration is the test's input, not a wait for a signal)."""
    begin = time.monotonic()
    while True:
        elapsed = time.monotonic() - begin
        assert check(), f"{what}: no longer so after {elapsed:.2f}s"
        if elapsed >= seconds:
            return
        time.sleep(interval)
