"""NOTES.txt tells the truth of each install shape, through helm v4's offline dry run (helm
v3 needs a cluster for it): what is installed and what is not (alerts, ServiceMonitor,
dashboards, the prober, NFD), a rollout with a timeout for every DaemonSet the release
renders, a sample pod that runs as non-root in a named namespace, and where to look next."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.harness.chart import CHART, Helm, by_kind

NAMESPACE = "ate-system"


def _install(helm_v4: Helm, *sets: str) -> tuple[str, list[dict[str, Any]]]:
    """The NOTES and the manifests of one `helm install --dry-run=client`."""
    args = [a for s in sets for a in ("--set", s)]
    out = helm_v4.run("install", "ate-devplugin", str(CHART), "--dry-run=client", "-n", NAMESPACE, *args)
    assert out.returncode == 0, out.stderr
    manifests, notes = out.stdout.split("NOTES:", 1)
    docs = [d for d in yaml.safe_load_all(manifests.split("MANIFEST:", 1)[1]) if d]
    return notes, docs


def _section(notes: str, title: str) -> str:
    """The lines of the "Installed:" or "Not installed:" list."""
    found = re.search(rf"^{title}:\n((?:  .*\n)*)", notes, flags=re.MULTILINE)
    assert found, f"NOTES has no {title!r} list:\n{notes}"
    return found[1]


def _pods(notes: str) -> list[dict[str, Any]]:
    blocks = re.findall(r"<<'YAML'\n(.*?)\n     YAML\n", notes, flags=re.DOTALL)
    docs = [d for b in blocks for d in yaml.safe_load_all("\n".join(line[5:] for line in b.splitlines())) if d]
    return [d for d in docs if d["kind"] == "Pod"]


def _check_common(notes: str, docs: list[dict[str, Any]]) -> None:
    """What every shape's NOTES must hold."""
    daemonsets = {d["metadata"]["name"] for d in by_kind(docs, "DaemonSet")}
    rollouts = re.findall(r"kubectl -n ate-system rollout status daemonset/(\S+)( --timeout=\S+)?", notes)
    assert {name for name, _ in rollouts} == daemonsets, "one rollout per DaemonSet of the release"
    assert all(timeout == " --timeout=5m" for _, timeout in rollouts), "every rollout with a timeout"
    for name in daemonsets:
        assert f"DaemonSet ate-system/{name}:" in _section(notes, "Installed")
    pods = _pods(notes)
    assert pods, "a sample pod"
    for pod in pods:
        assert pod["metadata"]["namespace"] == "vm-workers"
        security = pod["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] >= 10000
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert "privileged" not in str(pod)
    assert "kubectl create namespace vm-workers --dry-run=client -o yaml | kubectl apply -f -" in notes
    assert re.search(r"kubectl -n vm-workers logs \S+", notes)
    for page in ("docs/install.md", "docs/upgrade.md", "docs/uninstall.md", "docs/runbook.md"):
        assert f"https://github.com/ate-dev/ate-devplugin/blob/v0.1.0/{page}" in notes


def test_a_default_install_says_what_it_did_not_install(helm_v4: Helm) -> None:
    notes, docs = _install(helm_v4)
    _check_common(notes, docs)
    installed, missing = _section(notes, "Installed"), _section(notes, "Not installed")
    assert "DaemonSet ate-system/ate-devplugin-kvm-prober: the KVM prober" in installed
    assert "2 Grafana dashboards, as ConfigMaps labelled grafana_dashboard=1 in ate-system" in installed
    assert "no alerts: no PrometheusRule" in missing
    assert "no ServiceMonitor or PodMonitor" in missing
    assert "no NodeFeatureRule" in missing
    assert "no KVM node labels from NFD" in missing
    assert not by_kind(docs, "PrometheusRule")
    assert not by_kind(docs, "ServiceMonitor")
    assert len([d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]) == 2


def test_an_install_with_monitoring_names_it(helm_v4: Helm) -> None:
    notes, docs = _install(
        helm_v4, "serviceMonitor.enabled=true", "prometheusRule.enabled=true", "forceMonitoringApi=true"
    )
    _check_common(notes, docs)
    installed, missing = _section(notes, "Installed"), _section(notes, "Not installed")
    assert "a ServiceMonitor (serviceMonitor.enabled)" in installed
    assert "the alerts, as a PrometheusRule (prometheusRule.enabled)" in installed
    assert "no alerts" not in missing
    assert "ServiceMonitor" not in missing
    assert by_kind(docs, "PrometheusRule")
    assert by_kind(docs, "ServiceMonitor")


def test_monitoring_asked_for_without_its_api_is_not_called_installed(helm_v4: Helm) -> None:
    notes, _ = _install(helm_v4, "prometheusRule.enabled=true")
    assert "no alerts: no PrometheusRule" in _section(notes, "Not installed")
    assert "WARNING: prometheusRule.enabled is true" in notes


def test_a_dra_install_names_its_device_classes_and_claims_as_non_root(helm_v4: Helm) -> None:
    notes, docs = _install(helm_v4, "dra.mode=dra")
    _check_common(notes, docs)
    installed = _section(notes, "Installed")
    assert "DaemonSet ate-system/ate-devplugin: the daemon, dra mode (the DRA driver ate.dev)" in installed
    assert "DeviceClasses kvm.ate.dev (cluster-wide: uninstalling this release deletes them" in installed
    (pod,) = _pods(notes)
    assert pod["spec"]["resourceClaims"]


def test_an_install_without_the_prober_says_so(helm_v4: Helm) -> None:
    notes, docs = _install(helm_v4, "kvmProbe.enabled=false")
    _check_common(notes, docs)
    assert "kvm-prober" not in notes
    assert "no KVM prober (kvmProbe.enabled=false): /dev/kvm is judged by its existence alone" in _section(
        notes, "Not installed"
    )


def test_pools_each_roll_out_with_their_probers(helm_v4: Helm) -> None:
    notes, docs = _install(
        helm_v4, "pools.a.nodeSelector.p=a", "pools.b.nodeSelector.p=b", "pools.b.kvmProbe.enabled=false"
    )
    _check_common(notes, docs)
    assert "daemonset/ate-devplugin-a-kvm-prober --timeout=5m" in notes
    assert "ate-devplugin-b-kvm-prober" not in notes
