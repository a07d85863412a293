"""Whether a test's call phase failed, for fixtures that print logs only then.

The top-level tests/conftest.py records it (its makereport hook); fixtures anywhere read it.
"""

from __future__ import annotations

import pytest

CALL_FAILED = pytest.StashKey[bool]()


def call_failed(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.stash.get(CALL_FAILED, False))
