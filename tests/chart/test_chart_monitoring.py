"""Monitoring objects: rendered only when enabled and their API exists (or forced), the
`node` relabeling, the PrometheusRule built from chart/files/alerts*.yaml, one dashboard
ConfigMap per dashboards/*.json (and the chart's copy in sync), the install notes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.harness.chart import CHART, REPO, Helm, Manifest, by_kind, one

MONITORS = {"ServiceMonitor": "serviceMonitor", "PodMonitor": "podMonitor", "PrometheusRule": "prometheusRule"}
NODE_RELABEL = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
ALERT_FILES = sorted((CHART / "files").glob("alerts*.yaml"))
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))


@pytest.mark.parametrize("kind", MONITORS)
def test_monitoring_objects_gated_on_api(helm: Helm, kind: str) -> None:
    enable = [f"{MONITORS[kind]}.enabled=true"]
    assert not by_kind(helm.template(), kind), "off by default"
    assert not by_kind(helm.template(sets=enable), kind), "enabled but no API: must not render"
    other_kinds = [f"monitoring.coreos.com/v1/{k}" for k in MONITORS if k != kind]
    assert not by_kind(helm.template(sets=enable, api_versions=other_kinds), kind), "another kind's API is not enough"
    assert by_kind(helm.template(sets=enable, api_versions=[f"monitoring.coreos.com/v1/{kind}"]), kind)
    assert by_kind(helm.template(sets=[*enable, "forceMonitoringApi=true"]), kind)
    assert not by_kind(helm.template(sets=["forceMonitoringApi=true"]), kind), "forced but not enabled"


def _scrape_endpoint(doc: Manifest) -> dict[str, Any]:
    endpoints = doc["spec"]["endpoints" if doc["kind"] == "ServiceMonitor" else "podMetricsEndpoints"]
    (endpoint,) = endpoints
    result: dict[str, Any] = endpoint
    return result


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_scrape_config(helm: Helm, kind: str) -> None:
    sets = [f"{MONITORS[kind]}.enabled=true", "forceMonitoringApi=true"]
    docs = helm.template(sets=sets)
    monitor = one(docs, kind)
    endpoint = _scrape_endpoint(monitor)
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert endpoint["relabelings"][0] == NODE_RELABEL
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [monitor["metadata"]["namespace"]]}
    ds = one(docs, "DaemonSet")
    # The selector finds the pods (PodMonitor) or the Service in front of them (ServiceMonitor).
    target = ds["spec"]["template"]["metadata"] if kind == "PodMonitor" else one(docs, "Service")["metadata"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= target["labels"].items()
    # The job label value the alerts select on (job="ate-devplugin").
    assert target["labels"]["app.kubernetes.io/name"] == "ate-devplugin"


def test_user_relabelings_come_after_node(any_helm: Helm, write_values: Any) -> None:
    values = write_values(
        "forceMonitoringApi: true\n"
        "serviceMonitor:\n  enabled: true\n"
        "  relabelings: [{targetLabel: cluster, replacement: prod, action: replace}]\n"
    )
    endpoint = _scrape_endpoint(one(any_helm.template([values]), "ServiceMonitor"))
    assert endpoint["relabelings"] == [
        NODE_RELABEL,
        {"targetLabel": "cluster", "replacement": "prod", "action": "replace"},
    ]


def _source_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in ALERT_FILES:
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


def test_prometheus_rule_is_the_alerts_file(helm: Helm) -> None:
    if not ALERT_FILES:
        pytest.skip("no chart/files/alerts*.yaml yet")
    docs = helm.template(sets=["prometheusRule.enabled=true", "forceMonitoringApi=true"])
    assert one(docs, "PrometheusRule")["spec"]["groups"] == _source_groups()


def test_prometheus_rule_options(any_helm: Helm, write_values: Any) -> None:
    if not ALERT_FILES:
        pytest.skip("no chart/files/alerts*.yaml yet")
    source = [r for g in _source_groups() for r in g["rules"] if "alert" in r]
    dropped = source[0]["alert"]
    values = write_values(
        yaml.safe_dump(
            {
                "forceMonitoringApi": True,
                "prometheusRule": {
                    "enabled": True,
                    "disabledAlerts": [dropped],
                    "ruleLabels": {"team": "platform", "severity": "overridden?"},
                    "extraGroups": [{"name": "mine", "rules": [{"record": "x:y", "expr": "vector(1)"}]}],
                },
            }
        )
    )
    groups = one(any_helm.template([values]), "PrometheusRule")["spec"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert dropped not in alerts
    assert len(alerts) == len(source) - 1
    for rule in source[1:]:
        got = alerts[rule["alert"]]
        assert got["labels"]["team"] == "platform"
        # A rule's own labels win over ruleLabels.
        assert got["labels"]["severity"] == rule["labels"]["severity"]
        assert got["expr"] == rule["expr"]
        assert got["annotations"] == rule["annotations"]
    assert groups[-1] == {"name": "mine", "rules": [{"record": "x:y", "expr": "vector(1)"}]}


def test_dashboard_copy_in_sync() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "sync-chart-files.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}{out.stderr}"


def test_one_config_map_per_dashboard(helm: Helm) -> None:
    if not DASHBOARDS:
        pytest.skip("no dashboards/*.json yet")
    docs = helm.template()
    maps = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(maps) == len(DASHBOARDS)
    shipped = {key: value for cm in maps for key, value in cm["data"].items()}
    assert set(shipped) == {p.name for p in DASHBOARDS}
    for path in DASHBOARDS:
        assert json.loads(shipped[path.name]) == json.loads(path.read_text())
    assert not by_kind(helm.template(sets=["dashboards.enabled=false"]), "ConfigMap")[1:], "only the config remains"


def test_dashboard_options(any_helm: Helm) -> None:
    if not DASHBOARDS:
        pytest.skip("no dashboards/*.json yet")
    docs = any_helm.template(
        sets=["dashboards.namespace=grafana", "dashboards.folder=Node devices", "dashboards.labelValue=ate"]
    )
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    for cm in maps:
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "ate"
        assert cm["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "Node devices"}


def test_install_notes(helm_v4: Helm) -> None:
    """NOTES.txt, through helm v4's offline dry run (helm v3 needs a cluster for it)."""
    out = helm_v4.run(
        "install", "ate-devplugin", str(CHART), "--dry-run=client", "-n", "ate-system",
        "--set", "serviceMonitor.enabled=true",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n ate-system rollout status daemonset/ate-devplugin" in notes
    assert r".status.allocatable.ate\.dev/kvm" in notes
    assert "ate.dev/kvm: 1" in notes
    assert "WARNING: serviceMonitor.enabled is true" in notes
    # The sample pod in the notes is a valid, unprivileged Pod.
    pod_text = notes.split("<<'YAML'\n", 1)[1].split("     YAML", 1)[0]
    pod = yaml.safe_load("\n".join(line[5:] for line in pod_text.splitlines()))
    assert pod["kind"] == "Pod"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"ate.dev/kvm": 1}
    assert "privileged" not in json.dumps(pod)
