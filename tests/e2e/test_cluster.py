"""The clusters themselves, before any chart: the two-node Kubernetes 1.37 cluster on
containerd 2 (what the DRA scenarios build on) and what every cluster promises.

* both nodes Ready with the 1.37 kubelet and containerd 2, and the 1.37 defaults the DRA
  migration needs (DRAExtendedResource GA, DRAConsumableCapacity and ResourceHealthStatus
  beta and on) reported by every component;
* each node has its own mount and network namespaces: its own kubelet directories and
  /run, its own /dev/kvm;
* pods placed by node labels (pools) on both nodes reach the API server through the
  ``kubernetes`` Service and each other, and the sandbox reaches them (as Prometheus does);
* every node's containerd finds a registry through the cluster's ``config_path``
  directory (containerd 2 and Debian's 1.6), and on every node of every cluster
  ``ghcr.io`` resolves to the sandbox's OCI registry, which answers and is pulled from;
* each node runs on its cluster's cgroup version (v2: the cgroup2 hierarchy in the node's
  mount namespace, no failCgroupV1), and on both a pod that makes its own /dev/kvm node
  cannot open it;
* a run killed with SIGKILL leaves no process, mount or link on the host, and its empty
  cgroups go with the next run's stale-cgroup sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e import cgroups
from tests.e2e.cluster import (
    API_SERVICE_IP,
    CONTAINERD2,
    GATEWAY,
    PAUSE_IMAGE,
    Cluster,
    Node,
    wait_until,
)
from tests.e2e.clusters import check_host, host_state
from tests.e2e.images import PLUGIN_IMAGE
from tests.e2e.registry import ADDRESS, HOST, serving
from tests.e2e.sandbox import Namespaces
from tests.e2e.userpath import run_pod, worker

REPO = Path(__file__).resolve().parents[2]
#: The 1.37 defaults the DRA migration relies on: gate -> stage.
GATES_137 = {"DRAExtendedResource": "", "DRAConsumableCapacity": "BETA", "ResourceHealthStatus": "BETA"}
POOL = "ate.dev/pool"
NET_NS = "e2e-net"

# Pod 1: answers GET / with its node's name. Pod 2 (argv[1]: pod 1's IP): asks it. Both
# first ask the API server for its version, as an in-cluster client does.
NET_PROBE = r"""
import http.server, json, os, signal, ssl, sys, urllib.request
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1 of its container: no default action
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}/version"
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
report = {"api": json.load(urllib.request.urlopen(req, context=ctx, timeout=20))["gitVersion"], "url": url}
if len(sys.argv) > 1:
    report["peer"] = urllib.request.urlopen(f"http://{sys.argv[1]}:8080/", timeout=20).read().decode()
    print(json.dumps(report), flush=True)
    sys.exit(0)
print(json.dumps(report), flush=True)
class Node(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["NODE_NAME"].encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("", 8080), Node).serve_forever()
"""


def feature_gates(metrics_text: str) -> dict[str, tuple[str, float]]:
    """``kubernetes_feature_enabled`` of a component's /metrics: name -> (stage, value)."""
    return {
        s.labels["name"]: (s.labels["stage"], s.value)
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "kubernetes_feature_enabled"
        for s in family.samples
    }


def test_two_nodes_of_1_37_on_containerd_2(cluster_137: Cluster) -> None:
    assert cluster_137.version() == "v1.37.2"
    assert [n.name for n in cluster_137.nodes] == ["e2e-node", "e2e-node-2"]
    for node in cluster_137.nodes:
        status = node.get()["status"]
        info = status["nodeInfo"]
        print(f"{node.name}: {info['kubeletVersion']} {info['containerRuntimeVersion']} {status['addresses']}")
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://2.4.2")
        assert {"type": "InternalIP", "address": node.ip} in status["addresses"]


def test_the_1_37_defaults_the_dra_migration_needs_are_on_everywhere(cluster_137: Cluster) -> None:
    pki = cluster_137.pki
    sources = {"kube-apiserver": cluster_137.kubectl("get", "--raw", "/metrics")}
    for name, port in (("kube-controller-manager", 10257), ("kube-scheduler", 10259)):
        sources[name] = cluster_137.sandbox.run([
            "curl", "-sfk", "--cert", f"{pki}/admin.crt", "--key", f"{pki}/admin.key", f"https://127.0.0.1:{port}/metrics",
        ]).stdout  # fmt: skip
    for node in cluster_137.nodes:
        sources[f"kubelet {node.name}"] = cluster_137.kubectl(
            "get", "--raw", f"/api/v1/nodes/{node.name}/proxy/metrics"
        )
    for component, text in sources.items():
        gates = feature_gates(text)
        found = {name: gates.get(name) for name in GATES_137}
        print(f"{component}: {found}")
        assert found == {name: (stage, 1.0) for name, stage in GATES_137.items()}, component


def namespaces_of(pid: int) -> tuple[str, str]:
    return os.readlink(f"/proc/{pid}/ns/mnt"), os.readlink(f"/proc/{pid}/ns/net")


def test_each_node_has_its_own_namespaces_and_kubelet_directories(cluster_137: Cluster) -> None:
    first, second = cluster_137.nodes
    seen = {"host": namespaces_of(os.getpid()), "sandbox": namespaces_of(cluster_137.sandbox.init_pid)}
    for node in cluster_137.nodes:
        assert node.kubelet is not None
        seen[node.name] = namespaces_of(node.kubelet.pid)
        assert node.run(["test", "-S", "/var/lib/kubelet/device-plugins/kubelet.sock"], check=False).returncode == 0
        assert node.run(["test", "-c", "/dev/kvm"], check=False).returncode == 0, "the device root of its plugin"
    mounts, nets = zip(*seen.values(), strict=True)
    assert len(set(mounts)) == len(set(nets)) == len(seen), seen
    marker = f"/run/ate-e2e-{uuid.uuid4().hex[:8]}"
    first.run(["touch", marker])
    try:
        assert second.run(["test", "-e", marker], check=False).returncode != 0
        assert cluster_137.sandbox.run(["test", "-e", marker], check=False).returncode != 0
        assert not os.path.exists(marker)
    finally:
        first.run(["rm", "-f", marker])


def net_pod(name: str, pool: str, *args: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NET_NS},
        "spec": {
            "nodeSelector": {POOL: pool}, "restartPolicy": "Never",
            "containers": [{
                "name": "probe", "image": PLUGIN_IMAGE, "imagePullPolicy": "Never",
                "command": ["python3", "-c", NET_PROBE, *args],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False},
            }],
        },
    }  # fmt: skip


def report(cluster: Cluster, name: str) -> dict[str, Any] | None:
    logs = cluster.kubectl("logs", "-n", NET_NS, name, check=False)
    return json.loads(logs.splitlines()[0]) if logs else None


@contextlib.contextmanager
def pools(cluster: Cluster, names: dict[Node, str]) -> Iterator[None]:
    for node, pool in names.items():
        node.label({POOL: pool})
    try:
        yield
    finally:
        for node in names:
            node.label({POOL: None})


def test_pods_placed_by_pool_reach_the_api_server_and_each_other(cluster_137: Cluster) -> None:
    first, second = cluster_137.nodes
    cluster_137.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NET_NS}})
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_until("the namespace's ServiceAccount", lambda: cluster_137.get_json("sa", "-n", NET_NS, "default"), 60)
    with pools(cluster_137, {first: "device-plugin", second: "dra"}):
        cluster_137.apply(net_pod("server", "device-plugin"))
        try:
            server = wait_until(
                "the server pod running",
                lambda: (
                    (p := cluster_137.get_json("pod", "-n", NET_NS, "server"))["status"].get("phase") == "Running"
                    and report(cluster_137, "server")
                    and p
                ),
                180,
            )
            ip = server["status"]["podIP"]
            cluster_137.apply(net_pod("client", "dra", ip))
            wait_until(
                "the client pod done",
                lambda: (
                    cluster_137.get_json("pod", "-n", NET_NS, "client")["status"].get("phase")
                    in ("Succeeded", "Failed")
                ),
                180,
            )
            client = cluster_137.get_json("pod", "-n", NET_NS, "client")
            reports = {"server": report(cluster_137, "server"), "client": report(cluster_137, "client")}
            print(f"server on {server['spec']['nodeName']} ({ip}), client on {client['spec']['nodeName']}: {reports}")
            assert (server["spec"]["nodeName"], client["spec"]["nodeName"]) == (first.name, second.name)
            assert ip.startswith(first.pod_subnet.removesuffix("0/24"))
            assert client["status"]["phase"] == "Succeeded"
            for got in reports.values():
                assert got is not None
                assert got["api"] == "v1.37.2"
                assert got["url"] == f"https://{API_SERVICE_IP}:443/version"
            assert (reports["client"] or {}).get("peer") == first.name
            # What Prometheus does: the sandbox reaches a pod of any node.
            assert cluster_137.sandbox.http_get(f"http://{ip}:8080/") == (200, first.name)
        finally:
            cluster_137.kubectl("delete", "namespace", NET_NS, "--wait=true", timeout=180)


class RecordingRegistry:
    """An HTTP server on the sandbox's gateway address that records what it is asked
    (client address, path) and has no image: enough to show who pulls from it."""

    def __init__(self, cluster: Cluster) -> None:
        self.requests: list[tuple[str, str]] = []
        recorded = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorded.append((self.client_address[0], self.path))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}')

            def do_HEAD(self) -> None:
                self.do_GET()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
                pass

        sock = cluster.sandbox.in_netns(lambda: socket.create_server((GATEWAY, 0)))
        self.server = HTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = sock
        self.address = f"{GATEWAY}:{sock.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, name="recording-registry", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("which", ["cluster_137", "cluster"])
def test_every_node_finds_a_registry_through_the_config_path(which: str, request: pytest.FixtureRequest) -> None:
    """A hosts.toml dropped into the cluster's registry directory (no restart) sends every
    node's pulls of ``registry.e2e.test`` to a server in the sandbox."""
    cluster: Cluster = request.getfixturevalue(which)
    registry = RecordingRegistry(cluster)
    host_dir = cluster.registry_config_dir / "registry.e2e.test"
    host_dir.mkdir()
    (host_dir / "hosts.toml").write_text(
        f'server = "http://{registry.address}"\n\n[host."http://{registry.address}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )
    names = []
    try:
        for node in cluster.nodes:
            name = f"pull-{node.name}"
            names.append(name)
            cluster.apply({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "containers": [
                    {"name": "c", "image": "registry.e2e.test/ate-e2e/probe:1", "imagePullPolicy": "Always"}]},
            })  # fmt: skip

        def asked_by_every_node() -> bool:
            asked = {ip for ip, path in registry.requests if path.startswith("/v2/ate-e2e/probe/manifests/1")}
            return asked == {n.ip for n in cluster.nodes}

        wait_until("every node asking the registry", asked_by_every_node, 120)
        print(f"{cluster.key}: the registry at {registry.address} was asked {sorted(set(registry.requests))}")
    finally:
        for name in names:
            cluster.kubectl("delete", "pod", "-n", "default", name, "--wait=true", check=False, timeout=120)
        registry.close()
        (host_dir / "hosts.toml").unlink()
        host_dir.rmdir()


REGISTRY_PROBE = "ate-e2e/door"  # a repository the registry does not have


def asked_for_manifest(log: str, ip: str) -> bool:
    """The registry's log has a request of ``ip`` for the probe's manifest."""
    path = f"/v2/{REGISTRY_PROBE}/manifests/1"
    return any(path in line and re.search(rf"(^|[\s\"=]){re.escape(ip)}[\s:]", line) for line in log.splitlines())


@pytest.mark.parametrize("which", ["cluster", "cluster_containerd2", "cluster_137"])
def test_every_node_resolves_and_reaches_the_registry_as_ghcr_io(which: str, request: pytest.FixtureRequest) -> None:
    """The sandbox's OCI registry (tests/e2e/registry.py) on every node of every cluster:
    ``ghcr.io`` resolves to it in the node's mount namespace (the cluster's /etc/hosts),
    HTTPS with its CA answers from the node's network namespace, and a pod's pull of
    ``ghcr.io/...`` by the node's containerd (hosts.toml in the config_path) reaches it
    from the node's address (the image does not exist: the registry answers 404)."""
    cluster: Cluster = request.getfixturevalue(which)
    names = []
    with serving(cluster, cluster.dir / "registry-door") as registry:
        assert registry.process is not None
        try:
            for node in cluster.nodes:
                assert node.run(["getent", "hosts", HOST]).stdout.split() == [ADDRESS, HOST], node.name
                assert node.run(registry.curl(f"https://{HOST}/v2/")).stdout.strip() == "{}", node.name
                name = f"pull-{node.name}"
                names.append(name)
                cluster.apply({
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "containers": [
                        {"name": "c", "image": f"{HOST}/{REGISTRY_PROBE}:1", "imagePullPolicy": "Always"}]},
                })  # fmt: skip
            log = registry.process.log_path
            ips = {n.ip for n in cluster.nodes}
            asked = lambda: all(asked_for_manifest(log.read_text(), ip) for ip in ips)  # noqa: E731
            wait_until(f"every node asking {HOST}", asked, 120)
            print(f"{cluster.key}: {HOST} resolved and pulled from by {[n.name for n in cluster.nodes]}")
        finally:
            for name in names:
                cluster.kubectl("delete", "pod", "-n", "default", name, "--wait=true", check=False, timeout=120)
    for node in cluster.nodes:
        assert node.run(["getent", "hosts", HOST], check=False).returncode != 0, f"{HOST} left on {node.name}"


# --- cgroup v1 and v2 nodes, and what guards a device there ------------------------------


@pytest.mark.parametrize("which", ["cluster", "cluster_containerd2", "cluster_137"])
def test_each_node_runs_on_the_cgroup_version_of_its_cluster(which: str, request: pytest.FixtureRequest) -> None:
    """Inside a v2 node /sys/fs/cgroup is the cgroup2 hierarchy, the kubelet reports
    cgroup version 2, runs without failCgroupV1 and without QoS cgroups, and its cgroup
    root has the controllers the kernel offers there; inside a v1 node it is the host's v1 mounts, the
    kubelet reports 1 and needs failCgroupV1: false."""
    cluster: Cluster = request.getfixturevalue(which)
    for node in cluster.nodes:
        fs = node.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"]).stdout.strip()
        config = json.loads((node.dir / "kubelet" / "config.yaml").read_text())
        text = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{node.name}/proxy/metrics")
        version = next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == "kubelet_cgroup_version")  # fmt: skip
        print(f"{cluster.key} {node.name}: /sys/fs/cgroup is {fs}; kubelet_cgroup_version {version}; "
              f"failCgroupV1 {config.get('failCgroupV1', 'unset')}")  # fmt: skip
        assert version == cluster.cgroup
        if cluster.cgroup == 2:
            root = node.run(["cat", f"/sys/fs/cgroup{node.cgroup_root}/cgroup.controllers"]).stdout.split()
            top = node.run(["cat", "/sys/fs/cgroup/cgroup.controllers"]).stdout.split()
            print(f"  controllers offered at the top: {top}; at the node's cgroup root: {root}")
            assert fs == "cgroup2fs"
            assert "failCgroupV1" not in config
            assert (config["cgroupsPerQOS"], config["enforceNodeAllocatable"]) == (False, [])
            assert set(root) == set(top) & set(cgroups.KUBELET_CONTROLLERS)
            assert not [h for h in cgroups.v1_hierarchies() if (h / node.cgroup_root.lstrip("/")).exists()]
        else:
            assert fs == "tmpfs"
            assert config["failCgroupV1"] is False


@pytest.mark.parametrize("which", ["cluster", "cluster_137"])
def test_a_pod_that_makes_its_own_kvm_node_cannot_open_it(which: str, request: pytest.FixtureRequest) -> None:
    """A pod without the request, root with CAP_MKNOD (inside the baseline Pod Security
    Standard), makes /dev/kvm (c 10 232) itself: QEMU cannot open it, EPERM. On cgroup v1
    the container's devices cgroup holds no rule for 10:232; on v2 no v1 devices cgroup
    holds the container (the node's cgroup root has none), so what refuses the open is
    the runtime's eBPF device filter."""
    cluster: Cluster = request.getfixturevalue(which)
    pod = worker("mknod-kvm", kvm=False, node=cluster.nodes[-1])
    del pod["spec"]["initContainers"]
    (vmm,) = pod["spec"]["containers"]
    del vmm["resources"]["limits"]["ate.dev/tun"]
    vmm["securityContext"].update(runAsUser=0, runAsGroup=0, runAsNonRoot=False,
                                  capabilities={"drop": ["ALL"], "add": ["MKNOD"]})  # fmt: skip
    report, qemu = vmm["command"][:4], vmm["command"][4:]
    net = {i for i, arg in enumerate(qemu) if arg.startswith(("tap,", "virtio-net-pci"))}
    qemu = [arg for i, arg in enumerate(qemu) if i not in net and i + 1 not in net]  # no NIC: KVM comes first
    made = 'mknod /dev/kvm c 10 232 && echo "ate-e2e: made $(stat -c "%A %u %g %t:%T" /dev/kvm)" && exec "$@"'
    vmm["command"] = [*report, "sh", "-c", made, "mknod", *qemu]
    run = run_pod(cluster, pod)
    print(f"{cluster.key}: {run.summary()}\n{run.logs}")
    assert "ate-e2e: made crw-r--r-- 0 0 a:e8" in run.logs
    assert run.facts()["CapEff"] == f"{1 << 27:016x}"  # CAP_MKNOD (27) only
    assert "Could not access KVM kernel module: Operation not permitted" in run.logs
    assert run.exit_code == 1
    if cluster.cgroup == 1:
        assert run.facts()["cgroup"] == "tmpfs"
        assert not [rule for rule in run.devices_list() if rule.startswith(("c 10:232 ", "a "))], run.devices_list()
    else:
        assert run.facts()["cgroup"] == "cgroup2fs"
        assert run.devices_list() == []
        node = cluster.nodes[-1]
        assert not [h for h in cgroups.v1_hierarchies() if (h / node.cgroup_root.lstrip("/")).exists()]


# --- a run killed with SIGKILL --------------------------------------------------------------


def process_tree(root: int) -> set[int]:
    """``root`` and every process below it (host PIDs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, todo = {root}, [root]
    while todo:
        pid = todo.pop()
        kids = {p for p, ppid in parents.items() if ppid == pid} - found
        found |= kids
        todo += kids
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_run_killed_with_sigkill_leaves_nothing_behind(cluster_137: Cluster, tmp_path: Path) -> None:
    """A process holding a two-node cluster with a pod on each node (containers, shims,
    pod network namespaces, overlay mounts) gets SIGKILL: no time for any clean-up of its
    own. Every process of it ends, the host is as before, and its cgroups (empty) are
    removed by the next run's sweep."""
    before = host_state()
    pause_archive = next(p for p in cluster_137.images if p.name == "pause.tar")
    log = tmp_path / "holder.log"
    with log.open("wb") as out:
        holder = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.run_cluster", "--workdir", str(tmp_path / "killed"), "--release", "1.37",
             "--runtime", CONTAINERD2, "--nodes", "2", "--cgroup", str(cluster_137.cgroup),
             "--image", str(pause_archive)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ready() -> dict[str, Any] | None:
        assert holder.poll() is None, f"the cluster holder exited: {log.read_text()[-4000:]}"
        line = next((x for x in log.read_text().splitlines() if x.startswith("{")), None)
        return json.loads(line) if line else None

    try:
        info = wait_until("the cluster up (its JSON line)", ready, 600, interval=1)
        sandbox = Namespaces(tmp_path, [])
        sandbox.init_pid = info["sandbox_pid"]
        env = {**os.environ, "KUBECONFIG": info["kubeconfig"]}
        wait_until(
            "the default ServiceAccount",
            lambda: sandbox.run([info["kubectl"], "get", "sa", "default"], env=env, check=False).returncode == 0,
            60,
        )
        for node in info["nodes"]:
            pause = {"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
            spec = {"nodeSelector": {"kubernetes.io/hostname": node["name"]}, "containers": [pause]}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hold-{node['name']}"}, "spec": spec}
            sandbox.run([info["kubectl"], "apply", "-f", "-"], stdin=json.dumps(pod), env=env)
        sandbox.run([info["kubectl"], "wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s"],
                    env=env, timeout=200)  # fmt: skip
        roots = [node["cgroup_root"] for node in info["nodes"]]
        pids = process_tree(holder.pid) | {p for root in roots for p in cgroups.procs(root)}
        in_pods = sum(len(cgroups.procs(r)) for r in roots)
        print(f"killing {holder.pid}: {len(pids)} processes, {in_pods} in pod cgroups")
        assert len(pids) > 20, pids
    finally:
        holder.kill()  # SIGKILL
        holder.wait(timeout=30)
    wait_until("every process of the killed run ended", lambda: not [p for p in pids if running(p)], 60)
    left = [root for root in roots if cgroups.left(root)]
    assert left == roots, "a killed run has no time to remove its cgroups"
    cgroups.remove_stale()
    assert not [r for r in roots if cgroups.left(r)]
    check_host(before)  # the sweep removed cgroups only: nothing else of the run was left
