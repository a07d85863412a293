"""Whether a test's call phase failed, for fixtures that print logs only then.

The top-level tests/conftest.py records it (its makereport hook); fixtures anywhere read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import pytest

CALL_FAILED = pytest.StashKey[bool]()


def call_failed(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.stash.get(CALL_FAILED, False))


class Logged(Protocol):
    log_path: Path

    def log_text(self) -> str: ...


def print_logs_if_failed(request: pytest.FixtureRequest, peers: Iterable[Logged], tail: int = 20000) -> None:
    """The last ``tail`` characters of each peer's log, when the test failed."""
    if call_failed(request):
        for peer in peers:
            print(f"----- {peer.log_path} -----\n{peer.log_text()[-tail:]}")
