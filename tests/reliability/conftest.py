"""Fixtures of the reliability tests (issue 6).

* ``bare_ns``: a private mount namespace whose ``/var/lib`` is an empty tmpfs: no
  ``/var/lib/kubelet`` at all, as on a node whose kubelet has not run yet.
(``spawn_daemon``, our daemon in any namespace with any arguments, is in tests/conftest.py.)

Repeat counts come from :func:`tests.harness.faults.soak` (``ATE_SOAK_SCALE``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.kubelet import Namespace


@pytest.fixture
def bare_ns(kubelet_version: str) -> Iterator[Namespace]:
    with Namespace(mkdirs=("/var/lib",)) as ns:
        yield ns
