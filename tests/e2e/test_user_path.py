"""The user's path on a real cluster: ``helm install``, a pod that opens /dev/kvm without
privilege, a kubelet restart, a plugin pod replaced, ``helm upgrade``, ``helm uninstall``,
and a real Prometheus scraping the plugin through service discovery.

It runs on two clusters (the ``user_cluster`` parameter): Kubernetes 1.35 with one node on
Debian's containerd 1.6, every test; and 1.37 with two nodes on containerd 2, the tests
marked ``every_release``: what the kubelet and the API server of a release decide. The
chart's own checks, the runtime's settings and the dashboards run once, on 1.35. On two
nodes the DaemonSet runs on both and every node is checked; a disruptive scenario acts on
the last node, and the first one is checked to go on undisturbed.

The tests of each cluster run in file order and share one release (installed with helm
v3 by the first test, removed by the uninstall test); helm v4 installs and uninstalls it
once more at the end. Each test asserts what the user would check with kubectl, curl and
Prometheus.

The node's allocatable lags the plugin pod's Ready by up to the kubelet's node status
period (10 s by default): every test waits on allocatable itself, never on Ready alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import CONTAINERD2, DEBIAN_CONTAINERD, Cluster, Node, wait_until
from tests.e2e.clusters import Clusters
from tests.e2e.monitoring import SandboxPrometheus, dashboard_queries, dashboard_values, fill, scraping
from tests.e2e.userpath import (
    KVM_API_VERSION,
    NAMESPACE,
    RESOURCE,
    Helm,
    consumer_pod,
    is_ready,
    kvm_rule,
    make_helm,
    metrics,
    plugin_pods,
    run_consumer,
    sample,
    wait_plugin_ready,
    watch_exit_code,
)
from tests.harness.monitoring import reads_dra, reads_pod_resources

REPO = Path(__file__).resolve().parents[2]
TUN = "ate.dev/tun"
#: A group for the device node of scenario 3b (kvm's fixed GID on Fedora and RHEL).
KVM_GID = 36
EACCES = "PermissionError: [Errno 13] Permission denied: '/dev/kvm'"
#: The clusters the path runs on: (release, runtime, nodes).
USER_CLUSTERS = {"k8s1.35": ("1.35", DEBIAN_CONTAINERD, 1), "k8s1.37-2nodes": ("1.37", CONTAINERD2, 2)}
every_release = pytest.mark.every_release


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "user_cluster" in metafunc.fixturenames:
        kinds = list(USER_CLUSTERS) if metafunc.definition.get_closest_marker("every_release") else ["k8s1.35"]
        metafunc.parametrize("user_cluster", kinds, indirect=True, scope="module")


@pytest.fixture(scope="module")
def user_cluster(request: pytest.FixtureRequest, clusters: Clusters) -> Iterator[Cluster]:
    """The cluster of this parameter. On /dev/kvm 0600 root:root the README's non-root pod
    needs containerd's device ownership: turned on where the cluster has it off
    (containerd 2), for this module only."""
    cluster = clusters.get(*USER_CLUSTERS[request.param])
    changed = [node for node in cluster.nodes if not node.device_ownership]
    for node in changed:
        node.restart_containerd(device_ownership=True)
    try:
        yield cluster
    finally:
        for node in changed:
            node.restart_containerd(device_ownership=False)


@pytest.fixture(scope="module")
def user_helm(user_cluster: Cluster) -> Helm:
    return make_helm("v3", user_cluster)


def last(cluster: Cluster) -> Node:
    """The node a disruptive scenario acts on (the second of two)."""
    return cluster.nodes[-1]


@pytest.fixture(scope="module")
def installed(user_cluster: Cluster, user_helm: Helm) -> Iterator[dict[str, Any]]:
    """``helm install`` with helm v3, as the README says; uninstalled at the end if a test
    did not do it."""
    start = time.monotonic()
    out = user_helm.install()
    ready = [is_ready(p) for p in plugin_pods(user_cluster)]
    record = {"notes": out.stdout, "helm_seconds": time.monotonic() - start, "ready_when_helm_returned": ready}
    try:
        yield record
    finally:
        if user_helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            user_helm.uninstall()


def registered(cluster: Cluster, pod: dict[str, Any], resource: str = RESOURCE) -> float | None:
    return sample(metrics(cluster, pod), "ate_devplugin_registered", resource_name=resource)


def only_plugin_pod(cluster: Cluster, node: Node) -> dict[str, Any]:
    (pod,) = plugin_pods(cluster, node)
    return pod


# --- 1. helm install ---------------------------------------------------------------------


@every_release
def test_helm_install_makes_the_node_offer_kvm(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    assert "rollout status daemonset/ate-devplugin" in installed["notes"], "NOTES say what to wait on"
    for node in user_cluster.nodes:
        pod = wait_plugin_ready(user_cluster, node)
        lag = node.wait_resource(RESOURCE, "4096")
        print(
            f"{node.name}: helm install --wait returned after {installed['helm_seconds']:.1f}s with plugin pods "
            f"Ready: {installed['ready_when_helm_returned']}; allocatable 4096 {lag:.1f}s after the rollout"
        )
        assert node.resource("capacity", RESOURCE) == "4096"
        assert registered(user_cluster, pod) == 1
        status, body = user_cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:9477/readyz")
        assert status == 200, body


# --- 7 (started early: it watches the whole path). Prometheus through service discovery --


@pytest.fixture(scope="module")
def prometheus(user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm) -> Iterator[SandboxPrometheus]:
    with scraping(user_cluster, str(user_helm.path)) as prom:
        yield prom


@every_release
def test_prometheus_finds_the_plugin_pod_with_the_service_monitor_labels(
    user_cluster: Cluster, prometheus: SandboxPrometheus
) -> None:
    prometheus.wait_for_targets_up(timeout=120)
    samples = prometheus.wait_for(
        'ate_devplugin_registered{resource_name="ate.dev/kvm"} == 1',
        lambda found: len(found) == len(user_cluster.nodes),
        timeout=60,
    )
    by_node = {s.labels["node"]: s.labels for s in samples}
    assert sorted(by_node) == sorted(n.name for n in user_cluster.nodes)
    for node in user_cluster.nodes:
        labels = by_node[node.name]
        assert labels["namespace"] == NAMESPACE
        assert labels["pod"] == only_plugin_pod(user_cluster, node)["metadata"]["name"]
        assert labels["job"] == "ate-devplugin"


# --- 2. a consumer pod --------------------------------------------------------------------


@every_release
def test_example_pod_opens_kvm_without_privilege(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    """The example as shipped: uid 10001, no capability, no privilege escalation, admitted
    under the restricted Pod Security Standard; the node's /dev/kvm is 0600 root:root and
    containerd sets device_ownership_from_security_context. On every node."""
    for node in user_cluster.nodes:
        result = run_consumer(user_cluster, consumer_pod("kvm-consumer", node=node))
        assert result["phase"] == "Succeeded", result
        assert result["uid"] == 10001
        assert result["cap_eff"] == "0000000000000000"
        assert result["no_new_privs"] == "1"
        assert result.get("api_version") == KVM_API_VERSION, result
        assert result["node"][1:] == [10001, 10001, 10, 232], result["node"]
        assert kvm_rule(result["devices_list"]) == ["c 10:232 rw"], result["devices_list"]


@every_release
def test_pod_without_the_request_has_no_kvm(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    result = run_consumer(user_cluster, consumer_pod("no-kvm", request=False, node=last(user_cluster)))
    assert result["node"] == "FileNotFoundError: [Errno 2] No such file or directory: '/dev/kvm'"
    assert kvm_rule(result["devices_list"]) == []


# --- 3. non-root consumers on a node where /dev/kvm is 0600 root:root -------------------


@contextlib.contextmanager
def containerd_device_ownership(node: Node, enabled: bool) -> Iterator[None]:
    node.restart_containerd(device_ownership=enabled)
    try:
        yield
    finally:
        node.restart_containerd(device_ownership=True)


@contextlib.contextmanager
def kvm_node_with_group(node: Node, gid: int) -> Iterator[None]:
    """/dev/kvm as distributions with a kvm group make it (0660 root:kvm), in the node's
    mount namespace only: a node of the same major:minor bind-mounted over it."""
    path = "/run/ate-e2e-kvm"
    node.run(["sh", "-ec", f"mknod -m 0660 {path} c 10 232; chown 0:{gid} {path}; "
                           f"mount --bind {path} /dev/kvm; stat -c '%a %u:%g %t:%T' /dev/kvm"])  # fmt: skip
    try:
        yield
    finally:
        node.run(["sh", "-ec", f"umount /dev/kvm; rm -f {path}"])


def test_non_root_pod_without_device_ownership_is_refused(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    node = user_cluster.node
    with containerd_device_ownership(node, enabled=False):
        result = run_consumer(user_cluster, consumer_pod("kvm-no-ownership", node=node))
    assert result["node"][:3] == ["crw-------", 0, 0], result["node"]
    assert result["error"] == EACCES
    assert result["phase"] == "Succeeded"  # the check script reports, it does not crash


def test_non_root_pod_with_the_device_group_as_supplemental_group(
    user_cluster: Cluster, installed: dict[str, Any]
) -> None:
    node = user_cluster.node
    with containerd_device_ownership(node, enabled=False), kvm_node_with_group(node, KVM_GID):
        with_group = run_consumer(user_cluster, consumer_pod("kvm-group", supplemental_groups=(KVM_GID,), node=node))
        without = run_consumer(user_cluster, consumer_pod("kvm-no-group", node=node))
    assert with_group["node"][:3] == ["crw-rw----", 0, KVM_GID], with_group["node"]
    assert KVM_GID in with_group["groups"]
    assert with_group.get("api_version") == KVM_API_VERSION, with_group
    assert without["error"] == EACCES


# --- 4. kubelet restart, plugin pod replaced ---------------------------------------------


def heartbeat(node: Node, status: dict[str, Any] | None = None) -> str:
    """When the kubelet last posted the node's status (its Ready condition's heartbeat)."""
    status = status or node.get()
    beat: str = next(c["lastHeartbeatTime"] for c in status["status"]["conditions"] if c["type"] == "Ready")
    return beat


@every_release
def test_kubelet_restart_needs_no_plugin_restart(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    node = last(user_cluster)
    others = {n.name: only_plugin_pod(user_cluster, n) for n in user_cluster.nodes if n is not node}
    pod = only_plugin_pod(user_cluster, node)
    restarts_before = pod["status"]["containerStatuses"][0]["restartCount"]
    assert sample(metrics(user_cluster, pod), "ate_devplugin_kubelet_restarts_total") == 0
    beat_before = heartbeat(node)
    node.stop_kubelet(signal.SIGKILL)
    node.start_kubelet()
    node.wait_ready()
    wait_until("the plugin to see the restart",
               lambda: sample(metrics(user_cluster, pod), "ate_devplugin_kubelet_restarts_total") == 1,
               120)  # fmt: skip
    wait_until("registered again", lambda: registered(user_cluster, pod) == 1, 120)

    def fresh_allocatable() -> bool:
        # A node status the restarted kubelet posted (it posts one when it starts, and
        # again when allocatable changes), with the plugin registered.
        status = node.get()
        return heartbeat(node, status) != beat_before and status["status"]["allocatable"].get(RESOURCE) == "4096"

    wait_until("allocatable 4096 from the restarted kubelet", fresh_allocatable, 120)
    same = only_plugin_pod(user_cluster, node)
    assert same["metadata"]["uid"] == pod["metadata"]["uid"]
    assert same["status"]["containerStatuses"][0]["restartCount"] == restarts_before
    result = run_consumer(user_cluster, consumer_pod("kvm-after-kubelet-restart", node=node))
    assert result.get("api_version") == KVM_API_VERSION, result
    # Another node's kubelet, and so its plugin, saw nothing of it (its own kubelet.sock).
    for other in others.values():
        assert sample(metrics(user_cluster, other), "ate_devplugin_kubelet_restarts_total") == 0
        assert registered(user_cluster, other) == 1


# --- a device that goes away and comes back ------------------------------------------------

PRIVATE_DEV = "/run/ate-e2e-dev"  # in each node's tmpfs: the host's /dev is never touched


@every_release
def test_device_gone_and_back_is_seen_by_the_node(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, prometheus: SandboxPrometheus
) -> None:
    """A device node that disappears (a module unloaded) and comes back. The host's /dev
    must stay as it is, so the plugins watch a device directory of each node's own
    (hostPaths.dev) holding a node of /dev/kvm's major:minor; pods still get /dev/kvm.
    It goes on the last node only: the others keep offering it."""
    kvm = f"{PRIVATE_DEV}/kvm"
    node = last(user_cluster)
    for n in user_cluster.nodes:
        n.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {kvm} c 10 232"])
    user_helm.upgrade("--set", f"hostPaths.dev={PRIVATE_DEV}")
    try:
        pod = wait_plugin_ready(user_cluster, node)
        wait_until("registered", lambda: registered(user_cluster, pod) == 1, 120)
        for n in user_cluster.nodes:
            n.wait_resource(RESOURCE, "4096")
        # Prometheus must see the counters before and after, or increase() has nothing to show.
        changes = f'ate_devplugin_device_health_changes_total{{pod="{pod["metadata"]["name"]}", health="%s"}}'
        prometheus.wait_for(changes % "unhealthy" + " == 0", timeout=120)
        node.run(["rm", kvm])
        node.wait_resource(RESOURCE, "0")
        assert node.resource("capacity", RESOURCE) == "4096"
        values = metrics(user_cluster, pod)
        assert sample(values, "ate_devplugin_devices", resource_name=RESOURCE, health="unhealthy") == 4096
        for other in user_cluster.nodes:
            if other is not node:
                assert other.resource("allocatable", RESOURCE) == "4096", other.name
        node.run(["mknod", "-m", "0600", kvm, "c", "10", "232"])
        node.wait_resource(RESOURCE, "4096")
        values = metrics(user_cluster, pod)
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="unhealthy")
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="healthy")
        prometheus.wait_for(changes % "healthy" + " >= 1", timeout=120)
    finally:
        user_helm.upgrade()
    for n in user_cluster.nodes:
        wait_plugin_ready(user_cluster, n)
        n.wait_resource(RESOURCE, "4096")


# --- 7. every dashboard query has data -----------------------------------------------------


def test_every_dashboard_query_returns_data_from_the_cluster(
    user_cluster: Cluster, prometheus: SandboxPrometheus
) -> None:
    values = dashboard_values(user_cluster.node)
    # The plugin pod was just replaced (previous test): wait until its own series are in.
    pod = only_plugin_pod(user_cluster, user_cluster.node)
    prometheus.wait_for(f'ate_devplugin_registered{{pod="{pod["metadata"]["name"]}"}} == 1', timeout=120)
    end = time.time()
    empty, checked = [], 0
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for where, expr, instant in dashboard_queries(json.loads(path.read_text())):
            if reads_pod_resources(expr) or reads_dra(expr):
                continue  # off by default: test_pods_holding_units.py and test_dra.py run these
            query = fill(expr, values)
            checked += 1
            if instant:
                found = prometheus.query(query, at=end)
                ok = bool(found)
            else:
                series = prometheus.query_range(query, prometheus.started_at, end, step=2)
                ok = any(v == v for s in series for _, v in s.values)  # v == v: not NaN
            if not ok:
                empty.append(f"{path.name} {where}: {query}")
    assert checked >= 20
    assert not empty, f"{len(empty)} of {checked} queries gave no data:\n" + "\n".join(empty)


@every_release
def test_deleted_plugin_pod_exits_0_and_is_replaced(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    node = last(user_cluster)
    old = only_plugin_pod(user_cluster, node)
    code, took = watch_exit_code(user_cluster, old["metadata"]["name"])
    assert code == 0, f"the deleted plugin pod's container exited {code}"
    new = wait_plugin_ready(user_cluster, node)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    wait_until("the new pod registered", lambda: registered(user_cluster, new) == 1, 120)
    node.wait_resource(RESOURCE, "4096")
    result = run_consumer(user_cluster, consumer_pod("kvm-after-new-plugin-pod", node=node))
    assert result.get("api_version") == KVM_API_VERSION, result
    print(f"plugin pod deleted in {took:.1f}s")


# --- 5. helm upgrade ------------------------------------------------------------------------


TWO_RESOURCES = """
deviceConfig:
  resources:
    - name: ate.dev/kvm
      devices: [/dev/kvm]
      units: 4096
    - name: ate.dev/tun
      devices: [/dev/net/tun]
      units: 16
"""


@pytest.fixture(scope="module")
def two_resources(user_cluster: Cluster) -> str:
    """A values file adding /dev/net/tun as ate.dev/tun next to /dev/kvm."""
    path = user_cluster.dir / "two-resources.yaml"
    path.write_text(TWO_RESOURCES)
    return str(path)


def test_helm_upgrade_adding_a_resource_rolls_out(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=true: the config checksum changed, so the pod is replaced."""
    node = user_cluster.node
    old = only_plugin_pod(user_cluster, node)
    user_helm.upgrade("-f", two_resources, "--set", "deviceConfig.restartOnChange=true")
    wait_until(
        "the rolled-out plugin pod",
        lambda: next(
            (p for p in plugin_pods(user_cluster, node) if p["metadata"]["uid"] != old["metadata"]["uid"]), None
        ),
        240,
    )
    pod = wait_plugin_ready(user_cluster, node)
    wait_until("both resources registered", lambda: registered(user_cluster, pod, TUN) == 1, 120)
    assert registered(user_cluster, pod) == 1
    node.wait_resource(TUN, "16")
    # The old pod's endpoints going away can zero it in a node status just before the
    # new pod's: wait on allocatable itself, as everywhere.
    node.wait_resource(RESOURCE, "4096")


def test_helm_upgrade_changing_a_resource_is_picked_up_live(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=false: the same pod reads the updated ConfigMap. The
    kubelet refreshes ConfigMap volumes on its pod sync (every minute by default; these
    clusters' kubelets sync every 10 s)."""
    node = user_cluster.node
    live = ("-f", two_resources, "--set", "deviceConfig.restartOnChange=false")
    user_helm.upgrade(*live)  # without the checksum annotation: the pod template changes once
    wait_plugin_ready(user_cluster, node)
    node.wait_resource(TUN, "16")
    before = only_plugin_pod(user_cluster, node)
    start = time.monotonic()
    user_helm.upgrade(*live, "--set", "deviceConfig.resources[1].units=32")
    waited = node.wait_resource(TUN, "32", timeout=300)
    after = only_plugin_pod(user_cluster, node)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert (
        after["status"]["containerStatuses"][0]["restartCount"]
        == before["status"]["containerStatuses"][0]["restartCount"]
    )
    assert node.resource("allocatable", RESOURCE) == "4096"
    print(f"units 16 -> 32 live: allocatable 32 after {time.monotonic() - start:.0f}s ({waited:.0f}s after helm)")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("deviceConfig.resources[1].units=0", "units"),
        ("deviceConfig.resources[1].devices[0]=/etc/shadow", "devices"),
        ("securityContext.privileged=true", "privileged"),
    ],
)
def test_helm_upgrade_with_a_bad_value_is_refused(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str, value: str, field: str
) -> None:
    node = user_cluster.node
    before = only_plugin_pod(user_cluster, node)
    tun = node.resource("allocatable", TUN)
    out = user_helm.upgrade("-f", two_resources, "--set", value, check=False)
    assert out.returncode != 0
    assert field in out.stderr, out.stderr
    after = only_plugin_pod(user_cluster, node)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert node.resource("allocatable", RESOURCE) == "4096"
    assert node.resource("allocatable", TUN) == tun


# --- 6. helm uninstall ----------------------------------------------------------------------


def sockets(node: Node) -> list[str]:
    out = node.run(["ls", "/var/lib/kubelet/device-plugins"]).stdout
    return sorted(name for name in out.split() if name.startswith("ate-"))


@every_release
def test_helm_uninstall_removes_the_socket_and_the_resource(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    assert len(plugin_pods(user_cluster)) == len(user_cluster.nodes)
    had_tun = {}
    for node in user_cluster.nodes:
        assert sockets(node), f"the plugin's sockets on {node.name} before uninstall"
        had_tun[node.name] = node.resource("capacity", TUN) is not None
    user_helm.uninstall()
    wait_until("the plugin pods gone", lambda: not user_cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    for node in user_cluster.nodes:
        assert sockets(node) == []
        node.wait_resource(RESOURCE, "0")
        if had_tun[node.name]:
            node.wait_resource(TUN, "0")


# --- 1 again, with helm v4 ------------------------------------------------------------------


def test_helm_v4_install_and_uninstall(user_cluster: Cluster) -> None:
    helm_v4 = make_helm("v4", user_cluster)
    node = user_cluster.node
    start = time.monotonic()
    out = helm_v4.install()
    ready = [is_ready(p) for p in plugin_pods(user_cluster)]
    print(f"helm v4 install --wait returned after {time.monotonic() - start:.1f}s with plugin pods Ready: {ready}")
    try:
        assert "rollout status daemonset/ate-devplugin" in out.stdout
        pod = wait_plugin_ready(user_cluster, node)
        node.wait_resource(RESOURCE, "4096")
        assert node.resource("capacity", RESOURCE) == "4096"
        assert registered(user_cluster, pod) == 1
    finally:
        helm_v4.uninstall()
    wait_until("the plugin pod gone", lambda: not user_cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    node.wait_resource(RESOURCE, "0")
    assert os.path.exists("/dev/kvm")
