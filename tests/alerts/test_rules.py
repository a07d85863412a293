"""The alert rules in chart/files/alerts.yaml: valid, unit-tested with promtool for every
alert (fires and stays quiet), written to convention with a runbook section each, and
healthy when a real Prometheus evaluates them against the daemon's real series."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.devices import DeviceNumber, add_device_node, can_mknod
from tests.harness.monitoring import RESOURCE, RulesScenario, rules_scenario
from tests.harness.prometheus import INSTALL
from tests.harness.require import require, require_tool
from tests.harness.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "chart" / "files" / "alerts.yaml"
TESTS = Path(__file__).resolve().parent / "alerts_test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
# The chart renders runbook_url from its home value at its version (the tag v<version>); the
# plain rules file writes the same out.
_HOME = yaml.safe_load((REPO / "chart" / "values.yaml").read_text())["home"]
_VERSION = yaml.safe_load((REPO / "chart" / "Chart.yaml").read_text())["version"]
RUNBOOK_URL = f"{_HOME}/blob/v{_VERSION}/docs/runbook.md#"
SEVERITIES = {"critical", "warning", "info"}


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def unit_tests() -> list[dict[str, Any]]:
    doc = yaml.safe_load(TESTS.read_text())
    return [case for test in doc["tests"] for case in test.get("alert_rule_test", [])]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


# --- promtool ----------------------------------------------------------------------------


def test_promtool_check_rules(promtool: str) -> None:
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout + out.stderr


def test_promtool_unit_tests(promtool: str) -> None:
    # promtool resolves rule_files relative to the test file, so this runs from anywhere.
    out = subprocess.run([promtool, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_quiet_test() -> None:
    names = {r["alert"] for r in alert_rules()}
    cases = unit_tests()
    tested = {c["alertname"] for c in cases}
    assert tested <= names, f"tests for alerts that do not exist: {sorted(tested - names)}"
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert not names - fires, f"alerts without a test where they fire: {sorted(names - fires)}"
    assert not names - quiet, f"alerts without a test where they stay quiet: {sorted(names - quiet)}"


# --- conventions ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_conventions(rule: dict[str, Any]) -> None:
    assert re.fullmatch(r"AteDevplugin[A-Z][A-Za-z]+", rule["alert"]), "CamelCase with the AteDevplugin prefix"
    assert rule["labels"]["severity"] in SEVERITIES
    notes = rule["annotations"]
    assert set(notes) == {"summary", "description", "runbook_url"}
    assert "{{" not in notes["summary"], "the summary is static: it groups alerts in notifications"
    assert "{{" in notes["description"], "the description says which node / resource, from labels"
    # On-call may have the alert and nothing else (a runbook link that does not open).
    assert re.search(r"Check first: \S", notes["description"]), "the description says what to check first"
    assert notes["runbook_url"] == RUNBOOK_URL + rule["alert"].lower()


def test_names_are_unique() -> None:
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names))


def test_runbook_has_one_section_per_alert() -> None:
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    alert_sections = {h.strip() for h in headings if h.startswith("AteDevplugin")}
    names = {r["alert"] for r in alert_rules()}
    assert alert_sections == names, "one '## <AlertName>' section per alert, and none for removed alerts"
    anchors = {github_anchor(h) for h in headings}
    for rule in alert_rules():
        assert rule["annotations"]["runbook_url"].split("#", 1)[1] in anchors


# --- a real Prometheus evaluating the rules ---------------------------------------------


def alert_states(live: RulesScenario) -> dict[str, list[dict[str, Any]]]:
    states: dict[str, list[dict[str, Any]]] = {}
    for alert in live.prometheus.alerts():
        states.setdefault(alert["labels"]["alertname"], []).append(alert)
    return states


def wait_for_alert(live: RulesScenario, name: str, state: str, timeout: float = 120.0) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((a for a in alert_states(live).get(name, []) if a["state"] == state), None)

    alert = wait_until(found, timeout, lambda: f"{name} {state}; alerts {alert_states(live)}", interval=0.5)
    assert alert is not None
    return alert


def test_rules_are_healthy_on_real_series(live_rules: RulesScenario) -> None:
    rules = live_rules.prometheus.wait_for_rules_evaluated()
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy


def test_the_kvm_alerts_on_a_socket_mode_daemons_real_series(tmp_path: Path) -> None:
    """The daemon as the chart runs it with kvmProbe.enabled (--kvm-probe socket), its probe
    period 1 s, and no prober: prober-gone after 3 periods starts AteDevpluginKvmProberGone's
    wait; a 1:3 node renamed over its kvm (the daemon's own check, no prober needed) starts
    AteDevpluginKvmProbeFailing's with reason not-a-kvm-device, and AteDevpluginDevicesUnhealthy
    leaves those Unhealthy units to it; the real node back ends the failure."""
    require_tool("prometheus", INSTALL)
    require(can_mknod(), "cannot mknod a device node (root?)")
    env = {
        "ATE_DEVPLUGIN_KVM_PROBE": "socket",
        "ATE_DEVPLUGIN_KVM_PROBE_PERIOD": "1",
        "ATE_DEVPLUGIN_KVM_PROBE_SOCKET": str(tmp_path / "prober.sock"),
    }
    with rules_scenario(tmp_path, env=env) as live:
        gone = wait_for_alert(live, "AteDevpluginKvmProberGone", "pending")
        assert (gone["labels"]["node"], gone["labels"]["resource_name"]) == ("node-a", RESOURCE)
        assert "no KVM prober connected" in gone["annotations"]["description"]

        root = live.node.device_root
        add_device_node(root, ".kvm.new", DeviceNumber(1, 3))
        (root / ".kvm.new").rename(root / "kvm")
        failing = wait_for_alert(live, "AteDevpluginKvmProbeFailing", "pending")
        assert failing["labels"]["reason"] == "not-a-kvm-device"
        assert (failing["labels"]["node"], failing["labels"]["resource_name"]) == ("node-a", RESOURCE)
        assert "fails with not-a-kvm-device" in failing["annotations"]["description"]
        live.prometheus.wait_for('ate_devplugin_devices{node="node-a", health="unhealthy"} > 0')
        time.sleep(3)  # three more evaluations of every rule on the Unhealthy units
        assert "AteDevpluginDevicesUnhealthy" not in alert_states(live), alert_states(live)

        add_device_node(root, ".kvm.new", "/dev/kvm")
        (root / ".kvm.new").rename(root / "kvm")
        wait_until(
            lambda: "AteDevpluginKvmProbeFailing" not in alert_states(live),
            30,
            lambda: f"KvmProbeFailing gone with the real node back; alerts {alert_states(live)}",
            interval=0.5,
        )
        # No prober can verify it: prober-gone again, and its alert waits anew.
        wait_for_alert(live, "AteDevpluginKvmProberGone", "pending")


def test_alerts_match_the_real_label_sets(live_rules: RulesScenario) -> None:
    """What the daemon's real series make of the rules: a refused Allocate, a rejected
    reload and an unregistered present device wait out their `for` (pending), the rest
    stay inactive; then a stopped daemon starts the Down alert's 5 minutes."""
    errors = wait_for_alert(live_rules, "AteDevpluginAllocateErrors", "pending")
    assert errors["labels"]["node"] == "node-a"
    assert errors["labels"]["code"] == "INVALID_ARGUMENT"
    assert "INVALID_ARGUMENT" in errors["annotations"]["description"]
    reload = wait_for_alert(live_rules, "AteDevpluginConfigReloadFailing", "pending")
    assert reload["labels"]["node"] == "node-a"
    assert reload["labels"]["pod"] == "ate-devplugin-node-a"
    pending = wait_for_alert(live_rules, "AteDevpluginNotRegistered", "pending")
    assert pending["labels"]["resource_name"] == "ate.dev/kvm"
    assert "node-a" in pending["annotations"]["description"]
    quiet = {
        "AteDevpluginDown",
        "AteDevpluginMetricsAbsent",
        "AteDevpluginDevicesUnhealthy",
        "AteDevpluginAllocateSlow",
    }
    assert not quiet & set(alert_states(live_rules)), alert_states(live_rules)

    assert live_rules.node.daemon.stop() == 0
    down = wait_for_alert(live_rules, "AteDevpluginDown", "pending")
    assert down["labels"]["node"] == "node-a"
    assert down["labels"]["job"] == "ate-devplugin"
