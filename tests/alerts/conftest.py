"""Fixtures for the alert tests. ``live_rules`` (module scope) is tests/harness/monitoring.py's
rules scenario: a daemon without a kubelet, scraped by a real Prometheus that loads
chart/files/alerts.yaml. Needs Debian's ``prometheus`` (server and promtool) and CAP_MKNOD
(root); without them tests are skipped locally and fail under CI=true."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.harness.monitoring import RulesScenario, can_make_device_nodes, rules_scenario
from tests.harness.prometheus import binary_missing


def require(why: str | None) -> None:
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture
def promtool() -> str:
    require(binary_missing("promtool"))
    return "promtool"


@pytest.fixture(scope="module")
def live_rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RulesScenario]:
    require(binary_missing("prometheus") or (None if can_make_device_nodes() else "cannot mknod (root?)"))
    with rules_scenario(tmp_path_factory.mktemp("alerts")) as scenario:
        yield scenario
