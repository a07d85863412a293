"""Fixtures for the dashboard tests: the fleet scenario scraped by a real Prometheus.

``fleet`` (module scope) runs tests/harness/monitoring.py's scenario: two daemons, the
kubelet bench (or the stand-in when the bench is not built), one Prometheus with the
project's alert rules. It needs Debian's ``prometheus`` and CAP_MKNOD (root); without them
the test is skipped locally and fails under CI=true.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.devices import can_mknod
from tests.harness.monitoring import FleetScenario, fleet_scenario
from tests.harness.prometheus import INSTALL
from tests.harness.require import require, require_tool


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetScenario]:
    require_tool("prometheus", INSTALL)
    require(can_mknod(), "cannot mknod a device node (root?)")
    with fleet_scenario(tmp_path_factory.mktemp("fleet")) as scenario:
        print(f"fleet scenario driven by the {scenario.driver_kind}")
        yield scenario
