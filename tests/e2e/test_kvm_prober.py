"""The KVM probe where the chart's daemon really runs: unprivileged, it cannot open host
devices, so the chart's prober pod (kvmProbe.enabled), granted one unit of ate.dev/kvm like
any consumer, probes the /dev/kvm it was given and reports over the socket in the node's
/run/ate-devplugin (docs/kvm-health.md, "Where the probe runs").

On the real 1.35 cluster (one node, containerd 1.6, cgroup v1) and the 1.37 cluster (two
nodes, containerd 2, cgroup v2): the node's real KVM device (10:232) -> the prober's probe
passes and the units are Healthy; a 1:3 node renamed over it -> every unit Unhealthy
(allocatable 0) with its reason in /readyz and the metrics; the real node back -> the
prober's probe passes again and allocatable is back. The plugin watches a device
directory of the node's own (hostPaths.dev): the host's /dev is never touched. The module
installs its release and removes it at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, ClusterError, wait_until
from tests.e2e.userpath import (
    NAMESPACE,
    RESOURCE,
    Helm,
    kvm_probe_states,
    metrics,
    plugin_pods,
    readyz,
    sample,
    unhealthy_in_status,
    wait_plugin_ready,
)

PRIVATE_DEV = "/run/ate-e2e-prober-dev"  # in the node's tmpfs: the host's /dev is never touched
KVM = f"{PRIVATE_DEV}/kvm"
PROBER_SELECTOR = "app.kubernetes.io/name=ate-devplugin-kvm-prober"


# 1.37 (("cluster_137", "helm_137")) is left out until run green: its last run, before the
# device ownership below was turned on there, had the prober connect and report, but its
# probe said no-permission (containerd 2 keeps the host node's 0600 root:root).
CLUSTERS = {"1.35": ("cluster", "helm"), "1.37": ("cluster_137", "helm_137")}


@pytest.fixture(scope="module", params=list(CLUSTERS))
def cluster_with_release(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The release with the prober on one cluster kind; uninstalled at the end."""
    cluster_fixture, helm_fixture = CLUSTERS[request.param]
    cluster: Cluster = request.getfixturevalue(cluster_fixture)
    helm: Helm = request.getfixturevalue(helm_fixture)
    # The daemon watches a directory of the node's own; pods (the prober too) get the host's
    # /dev/kvm, 0600 root:root on these machines: the non-root prober opens it through
    # containerd's device ownership (docs/non-root-consumers.md), on in the 1.35 cluster and
    # turned on here, for this module only, where it is off (containerd 2).
    changed = [node for node in cluster.nodes if not node.device_ownership]
    for node in changed:
        node.restart_containerd(device_ownership=True)
    for node in cluster.nodes:
        node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {KVM} c 10 232"])
    try:
        # A 2 s probe period: the prober is gone after 3 periods, 6 s (test_the_prober_gone).
        period = "daemon.extraArgs={--kvm-probe-period=2}"
        helm.install("--set", f"hostPaths.dev={PRIVATE_DEV}", "--set", "kvmProbe.enabled=true", "--set", period)
        yield cluster
    finally:
        if helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            helm.uninstall()
        wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        for node in cluster.nodes:
            node.run(["rm", "-rf", PRIVATE_DEV])
        for node in changed:
            node.restart_containerd(device_ownership=False)


def _prober(cluster: Cluster) -> dict[str, Any]:
    """The first node's prober pod."""
    (pod,) = _probers(cluster)
    return pod


def _probers(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", PROBER_SELECTOR)["items"]
    return [p for p in pods if p["spec"].get("nodeName") == cluster.node.name]


def _running_prober(cluster: Cluster) -> dict[str, Any] | None:
    pods = _probers(cluster)  # none yet: the DaemonSet makes it once the node advertises the resource
    return pods[0] if len(pods) == 1 and pods[0]["status"]["phase"] == "Running" else None


def _diagnose(cluster: Cluster) -> str:
    """What the first node's daemon and prober say, for a failure's message."""
    (daemon,) = plugin_pods(cluster, cluster.node)
    said = [f"daemon readyz: {readyz(cluster, daemon)!r}"]
    said.append("daemon log:\n" + cluster.kubectl("logs", "-n", NAMESPACE, daemon["metadata"]["name"], "--tail", "15"))
    for pod in _probers(cluster):
        said.append(f"prober {pod['metadata']['name']} status: {pod['status']}")
        name = pod["metadata"]["name"]
        said.append("prober log:\n" + cluster.kubectl("logs", "-n", NAMESPACE, name, "--tail", "15", check=False))
    return "\n".join(said)


def _state(cluster: Cluster) -> tuple[dict[str, Any], dict[str, float]]:
    (pod,) = plugin_pods(cluster, cluster.node)
    return pod, kvm_probe_states(cluster, pod)


def _reasons_now(cluster: Cluster) -> list[str]:
    """The reasons ate_devplugin_kvm_probe_reason says 1 for: the verdict that holds now (one at most)."""
    (pod,) = plugin_pods(cluster, cluster.node)
    found = metrics(cluster, pod).items()
    name = "ate_devplugin_kvm_probe_reason"
    return sorted(dict(ls)["reason"] for (n, ls), v in found if n == name and ("resource_name", RESOURCE) in ls and v)


def _verdicts(cluster: Cluster, reason: str) -> float:
    (pod,) = plugin_pods(cluster, cluster.node)
    return sample(metrics(cluster, pod), "ate_devplugin_kvm_probes_total", resource_name=RESOURCE, reason=reason) or 0.0


def test_the_prober_pod_is_unprivileged_and_holds_one_unit(cluster_with_release: Cluster) -> None:
    cluster = cluster_with_release
    # Scheduled once the node advertises the resource the prober requests.
    prober = wait_until("the prober pod running", lambda: _running_prober(cluster), 120)
    (c,) = prober["spec"]["containers"]
    assert c["resources"]["limits"][RESOURCE] == "1"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["privileged"] is False
    assert prober["spec"]["securityContext"]["runAsUser"] != 0
    print(f"prober pod {prober['metadata']['name']}: uid {prober['spec']['securityContext']['runAsUser']}, "
          f"limits {c['resources']['limits']}")  # fmt: skip


def test_the_real_device_passes_a_1_3_node_is_unhealthy_and_back(cluster_with_release: Cluster) -> None:
    cluster = cluster_with_release
    node = cluster.node
    wait_plugin_ready(cluster, node)
    print(f"Kubernetes {cluster.version()}, node {node.name}")
    # The real KVM node: the prober's report passes (only a report makes "passed").
    try:
        wait_until("the prober's verdict passed", lambda: _state(cluster)[1]["passed"] == 1, 120)
    except ClusterError:
        print(_diagnose(cluster))
        raise
    pod, states = _state(cluster)
    node.wait_resource(RESOURCE, "4096")
    passed_before = _verdicts(cluster, "passed")
    print(f"real 10:232 node: states {states}, passed verdicts {passed_before:g}, readyz {readyz(cluster, pod)!r}")

    # A 1:3 node renamed over it: the daemon's own 10:232 check, without the prober.
    start = time.monotonic()
    node.run(["sh", "-ec", f"mv {KVM} {KVM}.real; mknod -m 0600 {KVM}.new c 1 3; mv {KVM}.new {KVM}"])
    node.wait_resource(RESOURCE, "0")
    to_unhealthy = time.monotonic() - start
    pod, states = _state(cluster)
    said = readyz(cluster, pod)
    assert states["failed"] == 1, states
    assert "KVM probe failed: not-a-kvm-device:" in said, said
    assert _reasons_now(cluster) == ["not-a-kvm-device"]  # AteDevpluginKvmProbeFailing's reason label
    print(f"1:3 node: allocatable 0 after {to_unhealthy:.1f}s, states {states}, readyz {said!r}")
    if int(cluster.version().split(".")[1]) >= 36:  # ResourceHealthStatus: beta and on from 1.36
        # The pod status (KEP-4680): the prober holds one unit (the device plugin API has no message).
        in_status = partial(unhealthy_in_status, cluster, NAMESPACE, _prober(cluster)["metadata"]["name"])
        unhealthy = wait_until("the prober's pod status Unhealthy", in_status, 60)
        print(f"the prober's pod status: {unhealthy}")

    # The real node back: probed anew by the prober, passed, Healthy.
    start = time.monotonic()
    node.run(["mv", f"{KVM}.real", KVM])
    node.wait_resource(RESOURCE, "4096")
    to_healthy = time.monotonic() - start
    wait_until("a new passing report", lambda: _verdicts(cluster, "passed") > passed_before, 60)
    pod, states = _state(cluster)
    assert states["passed"] == 1, states
    assert _reasons_now(cluster) == ["passed"]
    said = readyz(cluster, pod)
    assert "KVM probe" not in said, said
    print(f"real node back: allocatable 4096 after {to_healthy:.1f}s, states {states}, "
          f"passed verdicts {_verdicts(cluster, 'passed'):g}, readyz {said!r}")  # fmt: skip
    prober = _prober(cluster)
    logs = cluster.kubectl("logs", "-n", NAMESPACE, prober["metadata"]["name"], "--tail", "5")
    print("prober's log:\n" + logs)
    # One prober all along: its reports came over one connection, it never restarted.
    assert prober["status"]["containerStatuses"][0]["restartCount"] == 0


def test_the_prober_gone_is_prober_gone_and_the_units_judged_by_existence(cluster_with_release: Cluster) -> None:
    """What AteDevpluginKvmProberGone reads, from the unprivileged daemon pod: the prober's
    DaemonSet deleted, state prober-gone once 3 periods (6 s here) have passed without it, no
    reason at 1 (no verdict holds), /readyz says so, and the units are Healthy by existence."""
    cluster = cluster_with_release
    wait_until("the prober's verdict passed", lambda: _state(cluster)[1]["passed"] == 1, 120)
    (daemonset,) = cluster.get_json("daemonsets", "-n", NAMESPACE, "-l", PROBER_SELECTOR)["items"]
    start = time.monotonic()
    cluster.kubectl("delete", "daemonset", "-n", NAMESPACE, daemonset["metadata"]["name"], "--wait=false")
    wait_until("state prober-gone", lambda: _state(cluster)[1]["prober-gone"] == 1, 60)
    to_gone = time.monotonic() - start
    pod, states = _state(cluster)
    assert [s for s, v in states.items() if v] == ["prober-gone"], states
    assert _reasons_now(cluster) == []
    said = readyz(cluster, pod)
    assert "KVM probe: no prober for " in said, said
    cluster.node.wait_resource(RESOURCE, "4096")
    print(f"prober DaemonSet deleted: prober-gone after {to_gone:.1f}s, states {states}, readyz {said!r}")
