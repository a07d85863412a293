"""The alerts as the chart renders them for a release (real helm), evaluated by promtool and
by a real Prometheus scraping the real daemon.

A second install with ``nameOverride`` gets its own job: its Down alert fires when its
pod stops answering, and its MetricsAbsent stays quiet while its target exists. The source
file's selector (job="ate-devplugin") evaluated on the same series shows what a hard-coded
job did instead: no Down, a MetricsAbsent. Aggregation labels keep two clusters apart,
and per-alert settings change what fires when.

The promtool cases leave the annotations out of the rendered file: their texts are
tested on the source file by alerts_test.yaml; here labels and timing are.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.chart import HELM_MAJORS, Helm, helm_path, one
from tests.harness.devices import can_mknod
from tests.harness.monitoring import ALERTS_FILE, RulesScenario, rules_scenario
from tests.harness.prometheus import INSTALL
from tests.harness.require import missing_tool, require, require_tool
from tests.harness.wait import wait_until

# Allocate refused every 5 minutes from 2m to 22m.
FAILING = "0 0 1x4 2x4 3x4 4x4 5x20"
NODE_A = {"instance": "10.0.0.1:9477", "namespace": "ate-system", "node": "node-a", "pod": "kvm-x7k2p"}


@pytest.fixture(scope="module")
def helm() -> Helm:
    for major in reversed(HELM_MAJORS):
        path = helm_path(major)
        if path is not None:
            return Helm(major, path)
    missing_tool("helm (build/bin/helm-v3 or helm-v4)", "tools/build-helm.sh")


def render(helm: Helm, dest: Path, *sets: str, annotations: bool = False) -> Path:
    """The release's rules as a plain rule file (the PrometheusRule's groups)."""
    docs = helm.template(sets=["prometheusRule.enabled=true", "forceMonitoringApi=true", *sets])
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    if not annotations:
        for group in groups:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    dest.write_text(yaml.safe_dump({"groups": groups}))
    return dest


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def promtool_test(promtool: str, workdir: Path, rules: Path, tests: list[dict[str, Any]]) -> None:
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}
    path = workdir / f"{rules.stem}_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def fires(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": dict(ls)} for ls in labels]}


def test_a_renamed_release_has_its_own_down_and_no_metrics_absent(promtool: str, helm: Helm, tmp_path: Path) -> None:
    rules = render(helm, tmp_path / "kvm.yaml", "nameOverride=kvm")
    # The first install (job ate-devplugin) runs on; the second's pod on node-a stops answering.
    inputs = [
        series("up", "1 1 0x30", job="kvm", **NODE_A),
        series("up", "1x32", job="ate-devplugin", **{**NODE_A, "pod": "ate-devplugin-m4q9z"}),
    ]
    down = {"severity": "critical", "job": "kvm", **NODE_A}
    promtool_test(promtool, tmp_path, rules, [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [
            fires("AteDevpluginDown", "6m"),
            fires("AteDevpluginDown", "8m", down),
            fires("AteDevpluginMetricsAbsent", "30m"),
        ],
    }])  # fmt: skip


def test_what_a_hard_coded_job_did_to_a_renamed_release(promtool: str, tmp_path: Path) -> None:
    """The same stopped pod of job kvm, against the source file's job="ate-devplugin" alone:
    no Down, and a MetricsAbsent that says nothing is scraped. What the test above guards against."""
    inputs = [series("up", "1 1 0x30", job="kvm", **NODE_A)]
    rules = tmp_path / "source.yaml"
    source = yaml.safe_load(ALERTS_FILE.read_text())
    for group in source["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules.write_text(yaml.safe_dump(source))
    promtool_test(promtool, tmp_path, rules, [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [
            fires("AteDevpluginDown", "8m"),
            fires("AteDevpluginMetricsAbsent", "16m", {"severity": "warning", "job": "ate-devplugin"}),
        ],
    }])  # fmt: skip


def test_aggregation_labels_keep_clusters_apart(promtool: str, helm: Helm, tmp_path: Path) -> None:
    """Two clusters whose nodes share addresses (the same pod CIDR), seen by one Prometheus:
    with aggregationLabels [cluster] each keeps its alert, and cluster a's unregistered
    but absent device is not joined with cluster b's present one."""
    same = {"job": "ate-devplugin", **NODE_A, "resource_name": "ate.dev/kvm"}
    inputs = [
        series("ate_devplugin_allocate_requests_total", FAILING, cluster="a", code="INTERNAL", **same),
        series("ate_devplugin_allocate_requests_total", FAILING, cluster="b", code="INTERNAL", **same),
        series("ate_devplugin_registered", "0x30", cluster="a", **same),
        series("ate_devplugin_device_nodes_present", "0x30", cluster="a", **same),
        series("ate_devplugin_registered", "1x30", cluster="b", **same),
        series("ate_devplugin_device_nodes_present", "1x30", cluster="b", **same),
    ]
    errors = {k: v for k, v in same.items() if k not in ("instance", "pod")}
    per_cluster = [{"severity": "warning", "cluster": c, "code": "INTERNAL", **errors} for c in ("a", "b")]
    tests = [
        fires("AteDevpluginAllocateErrors", "20m", *per_cluster),
        fires("AteDevpluginNotRegistered", "20m"),
    ]
    joined = render(helm, tmp_path / "clusters.yaml", "prometheusRule.aggregationLabels={cluster}")
    promtool_test(promtool, tmp_path, joined, [{"interval": "1m", "input_series": inputs, "alert_rule_test": tests}])
    # Without the label the two clusters' errors are summed into one, and the join finds
    # cluster b's device for cluster a's registration: a NotRegistered for a device that is not there.
    alone = render(helm, tmp_path / "one-cluster.yaml")
    wrong = {"severity": "critical", "cluster": "a", **same}
    promtool_test(promtool, tmp_path, alone, [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [
            fires("AteDevpluginAllocateErrors", "20m", {"severity": "warning", "code": "INTERNAL", **errors}),
            fires("AteDevpluginNotRegistered", "20m", wrong),
        ],
    }])  # fmt: skip


def test_per_alert_for_and_severity(promtool: str, helm: Helm, tmp_path: Path) -> None:
    down = "prometheusRule.alerts.AteDevpluginDown"
    team = "prometheusRule.ruleLabels.team=vm"
    rules = render(helm, tmp_path / "site.yaml", f"{down}.for=10m", f"{down}.severity=warning", team)
    inputs = [series("up", "1 1 0x20", job="ate-devplugin", **NODE_A)]
    promtool_test(promtool, tmp_path, rules, [{
        "interval": "1m", "input_series": inputs,
        "alert_rule_test": [
            fires("AteDevpluginDown", "8m"),
            fires("AteDevpluginDown", "13m", {"severity": "warning", "team": "vm", "job": "ate-devplugin", **NODE_A}),
        ],
    }])  # fmt: skip


# --- the renamed release against a real Prometheus and the real daemon -----------------------


@pytest.fixture(scope="module")
def renamed(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RulesScenario]:
    """A release with nameOverride=kvm: its rules, Down and MetricsAbsent after 5 seconds,
    loaded by a Prometheus that scrapes the daemon with job kvm, as its ServiceMonitor would."""
    require_tool("prometheus", INSTALL)
    require(can_mknod(), "cannot mknod a device node (root?)")
    workdir = tmp_path_factory.mktemp("renamed")
    rules = render(helm, workdir / "kvm-rules.yaml", "nameOverride=kvm",
                   "prometheusRule.alerts.AteDevpluginDown.for=5s",
                   "prometheusRule.alerts.AteDevpluginMetricsAbsent.for=5s", annotations=True)  # fmt: skip
    with rules_scenario(workdir, rule_files=[rules], job="kvm") as scenario:
        yield scenario


def test_a_renamed_release_on_real_prometheus(renamed: RulesScenario) -> None:
    prometheus = renamed.prometheus

    def state(name: str) -> list[dict[str, Any]]:
        return [a for a in prometheus.alerts() if a["labels"]["alertname"] == name]

    rules = prometheus.wait_for_rules_evaluated()
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy
    assert prometheus.query('up{job="kvm"}')[0].value == 1
    # Before the first scrape absent() is true: with a 5s `for` MetricsAbsent may fire at
    # Prometheus' start (the default 15m covers it). What counts is from the pod going on.
    wait_until(lambda: not state("AteDevpluginMetricsAbsent"), 60, lambda: f"start-up alerts {prometheus.alerts()}")
    stopped = time.time()
    assert renamed.node.daemon.stop() == 0

    def firing_down() -> dict[str, Any] | None:
        return next((a for a in state("AteDevpluginDown") if a["state"] == "firing"), None)

    down = wait_until(firing_down, 120, lambda: f"Down firing; alerts {prometheus.alerts()}", interval=0.5)
    assert down is not None
    assert down["labels"]["job"] == "kvm"
    assert down["labels"]["node"] == "node-a"
    assert down["annotations"]["runbook_url"].endswith("#atedevplugindown")
    # Since the pod went, never pending, let alone firing: the target is there, and down.
    since = f"[{math.floor(time.time() - stopped)}s]"  # only evaluations after the stop
    assert not state("AteDevpluginMetricsAbsent"), prometheus.alerts()
    assert not prometheus.query(f'count_over_time(ALERTS{{alertname="AteDevpluginMetricsAbsent"}}{since})')
    assert prometheus.query(f'count_over_time(ALERTS{{alertname="AteDevpluginDown", alertstate="firing"}}{since})')
