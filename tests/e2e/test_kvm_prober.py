"""The KVM probe where the chart's daemon really runs, as a plain install gives it: unprivileged,
the daemon cannot open host devices, so the chart's prober pods (on by default), each granted
/dev/kvm through one unit of ate.dev/kvm-prober, probe the device they were given and report
over the socket in the node's /run/ate-devplugin (docs/kvm-health.md, "The chart: the prober").

On the real 1.35 cluster (one node, containerd 1.6, cgroup v1) and the 1.37 cluster (two
nodes, containerd 2, cgroup v2), with each runtime's own device ownership setting (off on
containerd 2: the prober, uid 0 without capabilities, opens the host's 0600 root:root node):
on 1.37 the second node has no KVM, and the install's --wait returns with every pod Running
(its prober admitted and given no device); the node's real KVM device (10:232) -> the prober's
probe passes; a 1:3 node renamed over it -> every unit of ate.dev/kvm Unhealthy with its
reason in /readyz and the metrics, ate.dev/kvm-prober still offered; the real node back ->
passes again; a root process of another group is refused at the prober's socket (logged,
counted) and a non-root one cannot reach it at all, while the prober stays heard; the prober
gone -> prober-gone. The plugin watches a device directory of the node's own
(hostPaths.dev): the host's /dev is never touched. The module installs its release and
removes it at the end.
"""

from __future__ import annotations

import json
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
    wait_plugin_ready,
)

PRIVATE_DEV = "/run/ate-e2e-prober-dev"  # in the node's tmpfs: the host's /dev is never touched
KVM = f"{PRIVATE_DEV}/kvm"
PROBER_RESOURCE = f"{RESOURCE}-prober"
PROBER_SELECTOR = "app.kubernetes.io/name=ate-devplugin-kvm-prober"
PROBER_GID = 65532  # the chart's kvmProbe.podSecurityContext.runAsGroup

CLUSTERS = {"1.35": ("cluster", "helm"), "1.37": ("cluster_137", "helm_137")}


@pytest.fixture(scope="module", params=list(CLUSTERS))
def cluster_with_release(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The release as installed by default (the prober on) on one cluster kind, the daemon
    watching a device directory of each node's own; on the two-node cluster the second node's
    has no KVM. Uninstalled at the end."""
    cluster_fixture, helm_fixture = CLUSTERS[request.param]
    cluster: Cluster = request.getfixturevalue(cluster_fixture)
    helm: Helm = request.getfixturevalue(helm_fixture)
    cluster.node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {KVM} c 10 232"])
    for node in cluster.nodes[1:]:
        node.run(["mkdir", "-p", PRIVATE_DEV])  # no KVM on this node
    try:
        # A 2 s probe period: the prober is gone after 3 periods, 6 s (test_the_prober_gone).
        period = "kvmProbe.periodSeconds=2"
        start = time.monotonic()
        out = helm.install("--set", f"hostPaths.dev={PRIVATE_DEV}", "--set", period)
        print(f"helm install --wait returned 0 after {time.monotonic() - start:.1f}s: {out.stdout.strip()[:200]!r}")
        yield cluster
    finally:
        if helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            helm.uninstall()
        wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        for node in cluster.nodes:
            node.run(["rm", "-rf", PRIVATE_DEV])


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


def test_every_pod_runs_where_there_is_kvm_and_where_there_is_none(cluster_with_release: Cluster) -> None:
    """The install's --wait returned (the fixture); every pod of the release is Running soon
    after (a prober waits for its node's status to show the resource it requests: the
    kubelet posts it every 10 s), nothing stays Pending; each node offers ate.dev/kvm-prober,
    and only the node with KVM ate.dev/kvm. The prober runs as uid 0 with no capability,
    holding one unit of its resource."""
    cluster = cluster_with_release
    start = time.monotonic()

    def all_running() -> list[dict[str, Any]] | None:
        found = cluster.get_json("pods", "-n", NAMESPACE)["items"]
        return found if {p["status"]["phase"] for p in found} == {"Running"} else None

    try:
        pods = wait_until("every pod of the release Running", all_running, 60)
    except ClusterError:
        for p in cluster.get_json("pods", "-n", NAMESPACE)["items"]:
            print(p["metadata"]["name"], p["status"]["phase"], p["status"].get("conditions"))
        raise
    print(f"every pod Running {time.monotonic() - start:.1f}s after the test began (the install's --wait had returned)")
    probers = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "ate-devplugin-kvm-prober"]
    assert sorted(p["spec"]["nodeName"] for p in probers) == sorted(n.name for n in cluster.nodes)
    for node in cluster.nodes:
        node.wait_resource(PROBER_RESOURCE, "4")
    cluster.node.wait_resource(RESOURCE, "4096")
    for node in cluster.nodes[1:]:
        assert node.resource("allocatable", RESOURCE) in (None, "0"), node.name
    prober = _prober(cluster)
    (c,) = prober["spec"]["containers"]
    assert c["resources"]["limits"] == {**c["resources"]["limits"], PROBER_RESOURCE: "1"}
    assert RESOURCE not in c["resources"]["limits"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["privileged"] is False
    assert (prober["spec"]["securityContext"]["runAsUser"], prober["spec"]["securityContext"]["runAsGroup"]) == (
        0,
        PROBER_GID,
    )
    summary = [(p["spec"]["nodeName"], p["metadata"]["name"], p["status"]["phase"]) for p in pods]
    print(f"Kubernetes {cluster.version()}: every pod Running {summary}; prober limits {c['resources']['limits']}")
    for node in cluster.nodes[1:]:
        (idle,) = [p for p in probers if p["spec"]["nodeName"] == node.name]
        log = cluster.kubectl("logs", "-n", NAMESPACE, idle["metadata"]["name"], "--tail", "3")
        (daemon,) = plugin_pods(cluster, node)
        print(f"{node.name} (no KVM): prober {idle['metadata']['name']} Running, its log {log.strip()!r}; "
              f"daemon readyz {readyz(cluster, daemon)!r}")  # fmt: skip


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
    assert node.resource("allocatable", PROBER_RESOURCE) == "4"  # the prober's own: still offered

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


CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    s.sendall(b'{"v":1,"hello":{"pod":"x/y","devices":{"ate.dev/kvm":"/dev/kvm"}}}\\n')
    s.sendall(b'{"v":1,"report":{"resource":"ate.dev/kvm","result":{"device":"/dev/kvm","reason":"run-failed",'
              b'"message":"/dev/kvm: forged","duration_s":0}}}\\n')
    print("answered", repr(s.recv(100)))
except OSError as e:
    print(type(e).__name__, e.strerror)
"""


def test_only_the_prober_is_heard_at_its_socket(cluster_with_release: Cluster) -> None:
    """Any local user: a non-root process cannot reach the socket (its directory is 0700); a
    root process of another group reaches it and is refused before it says anything, the
    refusal logged and counted; the prober's verdicts hold, and it stays connected."""
    cluster = cluster_with_release
    node = cluster.node
    wait_until("the prober's verdict passed", lambda: _state(cluster)[1]["passed"] == 1, 120)
    passed = _verdicts(cluster, "passed")
    socket = "/run/ate-devplugin/prober.sock"
    mode = node.run(["stat", "-c", "%a %U:%G", "/run/ate-devplugin", socket]).stdout.split("\n")
    nobody = node.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "python3", "-c", CONNECT, socket])
    other_group = node.run(["setpriv", "--regid=65534", "--clear-groups", "python3", "-c", CONNECT, socket])
    assert nobody.stdout.strip() == "PermissionError Permission denied", nobody.stdout
    assert other_group.stdout.strip() in ("answered b''", "ConnectionResetError Connection reset by peer",
                                          "BrokenPipeError Broken pipe"), other_group.stdout  # fmt: skip
    (pod,) = plugin_pods(cluster, node)
    counted = partial(
        lambda: sample(metrics(cluster, pod), "ate_devplugin_kvm_prober_refused_total", reason="identity")
    )
    wait_until("the refusal counted", lambda: (counted() or 0) >= 1, 30)
    log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"])
    refused = [line for line in log.splitlines() if "refused a connection to the KVM prober's socket" in line]
    assert len(refused) == 1, refused
    assert "uid 0 gid 65534" in refused[0], refused
    assert f"is not the prober (uid 0 gid {PROBER_GID})" in refused[0], refused
    # The prober is still heard: two more of its periodic reports, and the forged one counted nothing.
    wait_until("two more reports", lambda: _verdicts(cluster, "passed") >= passed + 2, 30)
    pod, states = _state(cluster)
    assert states["passed"] == 1, states
    assert _verdicts(cluster, "run-failed") == 0
    assert _prober(cluster)["status"]["containerStatuses"][0]["restartCount"] == 0
    print(f"socket directory and socket {mode[:2]}; uid 65534: {nobody.stdout.strip()!r}; uid 0 gid 65534: "
          f"{other_group.stdout.strip()!r}; the daemon logged once: {json.loads(refused[0])['msg']!r}; "
          f"refused {counted():g}; states after {states}")  # fmt: skip


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
