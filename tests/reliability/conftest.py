"""Fixtures of the reliability tests (issue 6).

* ``bare_ns``: a private mount namespace whose ``/var/lib`` is an empty tmpfs: no
  ``/var/lib/kubelet`` at all, as on a node whose kubelet has not run yet.
* ``spawn_daemon``: our daemon in any namespace, with any extra arguments, logs printed
  when the test fails.

Repeat counts come from :func:`harness.faults.soak` (``ATE_SOAK_SCALE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.daemon import DevicePluginDaemon
from harness.faults import SpawnDaemon
from harness.kubelet import Namespace
from harness.outcome import call_failed


@pytest.fixture
def bare_ns(kubelet_version: str) -> Iterator[Namespace]:
    with Namespace(mkdirs=("/var/lib",)) as ns:
        yield ns


@pytest.fixture
def spawn_daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SpawnDaemon]:
    """``spawn_daemon(device_root, ns=..., config=None, env=None, args=(), start=True)``."""
    made: list[DevicePluginDaemon] = []

    def make(device_root: Path, *, start: bool = True, **kwargs: Any) -> DevicePluginDaemon:
        d = DevicePluginDaemon(device_root, tmp_path / f"spawned{len(made)}", **kwargs)
        made.append(d)
        return d.start() if start else d

    try:
        yield make
    finally:
        for d in made:
            d.close()
            if call_failed(request):
                print(f"----- {d.log_path} -----\n{d.log_text()[-6000:]}")
