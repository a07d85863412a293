"""Monitoring objects: rendered only when enabled and their API exists (or forced), the
`node` relabeling, the PrometheusRule built from chart/files/alerts*.yaml, one dashboard
ConfigMap per dashboards/*.json (and the chart's copy in sync), the install notes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.harness.chart import CHART, REPO, Helm, HelmError, Manifest, by_kind, one, the_daemons

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
    ds = the_daemons(docs, "DaemonSet")
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
    groups = _source_groups()
    for group in groups:
        for rule in group["rules"]:
            rule["expr"] = _in_release(rule["expr"])
    assert one(docs, "PrometheusRule")["spec"]["groups"] == groups


def _in_release(expr: str) -> str:
    """A source expression as the chart renders it for release ate (defaults otherwise): its
    kube-state-metrics series read that release's DaemonSet, in its namespace."""
    for label in ("created_by_name", "daemonset"):
        expr = expr.replace(f'{label}="ate-devplugin"', f'namespace="ate-system", {label}=~"ate-ate-devplugin"')
    return expr


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
        assert got["expr"] == _in_release(rule["expr"])
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
    docs = helm.template(release="ate-devplugin")  # the default release: its files as generated
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


# --- alerts made for the release ------------------------------------------------------------

SERIES = re.compile(r"\b(up|ate_devplugin_[a-z_]+)\b(\{[^}]*\})?")
SOURCE_JOB = 'job="ate-devplugin"'


def _alerts(docs: list[Manifest]) -> dict[str, dict[str, Any]]:
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _render_rules(helm: Helm, *sets: str) -> dict[str, dict[str, Any]]:
    return _alerts(helm.template(sets=["prometheusRule.enabled=true", "forceMonitoringApi=true", *sets]))


def test_every_series_an_alert_reads_is_selected_by_job() -> None:
    """The chart rewrites job="ate-devplugin" and every `by (` / `on (`: the source file
    must spell them so, or a series or an aggregation would escape the release's values."""
    for group in _source_groups():
        for rule in group["rules"]:
            for found in SERIES.finditer(rule["expr"]):
                assert SOURCE_JOB in (found[2] or ""), f"{rule.get('alert')}: {found[0]} lacks {SOURCE_JOB}"
            for found in re.finditer(r"\b(by|on|without)\s*\(", rule["expr"]):
                assert found[0] in ("by (", "on ("), f"{rule.get('alert')}: write {found[0]!r} as 'by (' or 'on ('"


KSM_SERIES = re.compile(r"\b(kube_[a-z_]+)\b(\{[^}]*\})?")
SOURCE_DAEMONSET = re.compile(r'\b(created_by_name|daemonset)="ate-devplugin"')


def test_every_kube_state_metrics_series_names_the_source_daemonset() -> None:
    """The chart makes created_by_name / daemonset="ate-devplugin" the release's DaemonSets:
    a kube-state-metrics series without it would read every DaemonSet of the cluster."""
    found = 0
    for group in _source_groups():
        for rule in group["rules"]:
            for series in KSM_SERIES.finditer(rule["expr"]):
                assert SOURCE_DAEMONSET.search(series[2] or ""), f"{rule.get('alert')}: {series[0]}"
                found += 1
    assert found >= 3


def test_kube_state_metrics_series_follow_the_release(any_helm: Helm) -> None:
    """Every pool's DaemonSet, in the release's namespace; another release's are not read."""
    docs = any_helm.template(
        sets=[
            "prometheusRule.enabled=true",
            "forceMonitoringApi=true",
            "pools.a.nodeSelector.x=a",
            "pools.b.nodeSelector.x=b",
        ],
        release="dra",
        namespace="kvm",
    )
    expr = _alerts(docs)["AteDevpluginPodMissing"]["expr"]
    assert not SOURCE_DAEMONSET.search(expr)
    names = 'namespace="kvm", {}=~"dra-ate-devplugin-a|dra-ate-devplugin-b"'
    assert expr.count(names.format("created_by_name")) == 1
    assert expr.count(names.format("daemonset")) == 2


def test_alerts_follow_the_release_name(any_helm: Helm) -> None:
    source = [r for g in _source_groups() for r in g["rules"] if "alert" in r]
    alerts = _render_rules(any_helm, "nameOverride=kvm")
    assert set(alerts) == {r["alert"] for r in source}
    for rule in source:
        expr = alerts[rule["alert"]]["expr"]
        assert "ate-devplugin" not in expr
        assert expr.count('job="kvm"') == rule["expr"].count(SOURCE_JOB) > 0
    assert alerts["AteDevpluginDown"]["expr"] == 'up{job="kvm"} == 0'
    assert alerts["AteDevpluginMetricsAbsent"]["expr"] == 'absent(up{job="kvm"})'
    # The job the alerts read is the one the monitors give: the jobLabel's value.
    docs = any_helm.template(sets=["nameOverride=kvm", "serviceMonitor.enabled=true", "forceMonitoringApi=true"])
    assert one(docs, "Service")["metadata"]["labels"]["app.kubernetes.io/name"] == "kvm"
    assert one(docs, "ServiceMonitor")["spec"]["jobLabel"] == "app.kubernetes.io/name"
    # An own selector replaces it whole.
    mine = _render_rules(any_helm, 'prometheusRule.selector=job="devices"\\,cluster="eu1"')
    assert mine["AteDevpluginDown"]["expr"] == 'up{job="devices",cluster="eu1"} == 0'


def test_aggregation_labels_join_every_by_and_on(any_helm: Helm) -> None:
    alerts = _render_rules(any_helm, "prometheusRule.aggregationLabels={cluster,region}")
    joined = 0
    for rule in alerts.values():
        for found in re.finditer(r"\b(by|on) \(([^)]*)\)", rule["expr"]):
            assert found[2].startswith("cluster, region, "), rule["expr"]
            joined += 1
    assert joined == sum(len(re.findall(r"\b(by|on) \(", r["expr"])) for g in _source_groups() for r in g["rules"])
    assert joined >= 4
    errors = alerts["AteDevpluginAllocateErrors"]["expr"]
    assert "sum by (cluster, region, namespace, job, node, resource_name, code)" in errors


def test_per_alert_settings_and_runbook_prefix(any_helm: Helm, write_values: Any) -> None:
    values = write_values(
        yaml.safe_dump({
            "forceMonitoringApi": True,
            "prometheusRule": {
                "enabled": True,
                "runbookUrl": "https://wiki.example.com/ate#",
                "ruleAnnotations": {"dashboard_url": "https://grafana.example.com/d/x", "summary": "not this"},
                "alerts": {
                    "AteDevpluginDown": {"for": "10m", "severity": "warning", "labels": {"page": "no"}},
                    "AteDevpluginDevicesUnhealthy": {"annotations": {"summary": "site text"}},
                },
            },
        })
    )  # fmt: skip
    alerts = _alerts(any_helm.template([values]))
    source = {r["alert"]: r for g in _source_groups() for r in g["rules"] if "alert" in r}
    down = alerts["AteDevpluginDown"]
    assert down["for"] == "10m"
    assert down["labels"] == {"severity": "warning", "page": "no"}
    assert alerts["AteDevpluginDevicesUnhealthy"]["annotations"]["summary"] == "site text"
    for name, rule in alerts.items():
        assert rule["annotations"]["runbook_url"] == f"https://wiki.example.com/ate#{name.lower()}"
        assert rule["annotations"]["dashboard_url"] == "https://grafana.example.com/d/x"
        if name != "AteDevpluginDevicesUnhealthy":
            assert rule["annotations"]["summary"] == source[name]["annotations"]["summary"], "an alert's own wins"
        if name != "AteDevpluginDown":
            assert rule.get("for") == source[name].get("for")
            assert rule["labels"] == source[name]["labels"]


def test_every_alert_that_needs_a_for_has_one() -> None:
    for group in _source_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule.get("for"), f"{rule['alert']} has no for: one bad scrape or sample would page"


def test_settings_for_an_unknown_alert_are_refused(any_helm: Helm) -> None:
    with pytest.raises(HelmError, match=r"prometheusRule\.alerts\.AteDevpluginNoSuch: no such alert"):
        _render_rules(any_helm, "prometheusRule.alerts.AteDevpluginNoSuch.for=1m")
    with pytest.raises(HelmError, match="/prometheusRule/alerts"):
        _render_rules(any_helm, "prometheusRule.alerts.AteDevpluginDown.for=soon")


# --- the install notes of each mode -------------------------------------------------------------


def _notes(helm_v4: Helm, *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    out = helm_v4.run("install", "ate-devplugin", str(CHART), "--dry-run=client", "-n", "ate-system", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("NOTES:", 1)[1]


def _heredocs(notes: str) -> list[list[dict[str, Any]]]:
    """The manifests of each `kubectl apply -f - <<'YAML'` block in the notes."""
    blocks = re.findall(r"<<'YAML'\n(.*?)\n     YAML\n", notes, flags=re.DOTALL)
    return [[d for d in yaml.safe_load_all("\n".join(line[5:] for line in b.splitlines())) if d] for b in blocks]


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_install_notes_in_dra_modes(helm_v4: Helm, any_helm: Helm, mode: str) -> None:
    notes = _notes(helm_v4, f"dra.mode={mode}")
    assert "kubectl -n ate-system rollout status daemonset/ate-devplugin" in notes
    assert "kubectl get resourceslices --field-selector spec.driver=ate.dev" in notes
    assert ("allocatable" in notes) is (mode == "both"), "extended resources only where the device plugin runs"
    assert ("ate.dev/kvm: 1" in notes) is (mode == "both")
    blocks = _heredocs(notes)
    claimed = blocks[-1]
    template, pod = claimed
    assert template["kind"] == "ResourceClaimTemplate"
    classes = {c["metadata"]["name"] for c in by_kind(any_helm.template(sets=[f"dra.mode={mode}"]), "DeviceClass")}
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] in classes
    claim = {"name": request["name"], "resourceClaimTemplateName": template["metadata"]["name"]}
    assert pod["spec"]["resourceClaims"] == [claim]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": request["name"]}]}
    assert "privileged" not in json.dumps(pod)
    assert f"kubectl -n vm-workers delete resourceclaimtemplate {template['metadata']['name']}" in notes
    assert "grep '^ate_devplugin_" in notes
    # Offline the policy is rendered (every release DRA runs on serves it): no warning.
    assert "no policy keeps the driver to its own node's" not in notes
    off = _notes(helm_v4, f"dra.mode={mode}", "dra.sliceAdmissionPolicy=false")
    assert "dra.sliceAdmissionPolicy is false" in off
    # The sharing model's devices, and the unchanged pod spec where the release is 1.36+.
    assert "per resource one shareable device" in notes
    assert "32 single-claim devices" in notes
    assert "served by DRA too" not in notes, "offline: the release is not known"
    assert "served by DRA too" in _notes(helm_v4, f"dra.mode={mode}", "kubeVersionOverride=1.36")
    slots = _notes(helm_v4, f"dra.mode={mode}", "dra.sharing=slots", "dra.slots=8")
    assert "shareable" not in slots
    assert "per resource 8 single-claim devices" in slots
    sets = (f"dra.mode={mode}", "dra.extendedResourceName=false", "kubeVersionOverride=1.36")
    assert "served by DRA too" not in _notes(helm_v4, *sets)


def test_install_notes_name_every_pool(helm_v4: Helm) -> None:
    out = helm_v4.run("install", "ate-devplugin", str(CHART), "--dry-run=client", "-n", "ate-system",
                      "-f", str(CHART / "ci" / "pools-values.yaml"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    for pool in ("vm", "nfv"):
        assert f"kubectl -n ate-system rollout status daemonset/ate-devplugin-{pool}" in notes


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_install_notes_with_the_kvm_prober(helm_v4: Helm, mode: str) -> None:
    notes = _notes(helm_v4, f"dra.mode={mode}")  # on by default
    assert "kubectl -n ate-system rollout status daemonset/ate-devplugin-kvm-prober" in notes
    assert "grep '^ate_devplugin_kvm_probe_state'" in notes
    assert "one unit of ate.dev/kvm-prober" in notes
    assert ("and its devices tainted" in notes) is (mode == "dra")
    off = _notes(helm_v4, f"dra.mode={mode}", "kvmProbe.enabled=false")
    assert "kvm-prober" not in off
    assert "no KVM prober (kvmProbe.enabled=false)" in off
