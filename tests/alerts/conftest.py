"""Fixtures for the alert tests. ``live_rules`` (module scope) is tests/harness/monitoring.py's
rules scenario: a daemon without a kubelet, scraped by a real Prometheus that loads
chart/files/alerts.yaml. Needs Debian's ``prometheus`` (server and promtool) and CAP_MKNOD
(root); without them tests are skipped locally and fail under CI=true."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.devices import can_mknod
from tests.harness.monitoring import RulesScenario, rules_scenario
from tests.harness.prometheus import INSTALL
from tests.harness.require import require, require_tool


@pytest.fixture
def promtool() -> str:
    return require_tool("promtool", INSTALL)


@pytest.fixture(scope="module")
def live_rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RulesScenario]:
    require_tool("prometheus", INSTALL)
    require(can_mknod(), "cannot mknod a device node (root?)")
    with rules_scenario(tmp_path_factory.mktemp("alerts")) as scenario:
        yield scenario
