"""CDI on a real node: the one-node cluster on containerd 2 and cgroup v2, the chart with
/dev/kvm and /dev/net/tun as resources that answer Allocate with their CDI device name
only, and the micro-VM worker (docs/examples/microvm-worker-pod.yaml): QEMU as uid 10001
opens both because the daemon's CDI specs give the nodes mode 0666 in the container
(containerd's ``device_ownership_from_security_context`` is off and nothing else is set on
the node), and boots its guest.

The tests run in file order and share one release, removed by the uninstall test. The
last one checks the same chart on Debian's containerd 1.6 (the ``cluster`` fixture), with
its own release, removed before the user's-path tests install theirs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import CDI_SPEC_DIR, Cluster, wait_until
from tests.e2e.userpath import (
    NAMESPACE,
    RELEASE,
    RESOURCE,
    TUN,
    Helm,
    booted_as_shipped,
    metrics,
    run_pod,
    sample,
    wait_plugin_ready,
    worker,
)
from tests.e2e.vmm import NO_KVM

SPEC_FILE = f"{CDI_SPEC_DIR}/ate.dev-kvm.json"
TUN_SPEC_FILE = f"{CDI_SPEC_DIR}/ate.dev-tun.json"
CDI_RESOURCES: list[dict[str, Any]] = [
    {"name": RESOURCE, "devices": ["/dev/kvm"], "allocate": "cdi", "cdi": {"file_mode": "0666"}},
    {"name": TUN, "devices": ["/dev/net/tun"], "units": 1024, "allocate": "cdi", "cdi": {"file_mode": "0666"}},
]


def node_spec(cluster: Cluster, path: str = SPEC_FILE) -> dict[str, Any] | None:
    """A CDI spec file on the node (in its mount namespace, where containerd reads it), or None."""
    out = cluster.node.run(["cat", path], check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


@pytest.fixture(scope="module")
def installed(cluster_containerd2: Cluster, helm_containerd2: Helm) -> Iterator[None]:
    helm_containerd2.install("--set-json", f"deviceConfig.resources={json.dumps(CDI_RESOURCES)}")
    try:
        yield
    finally:
        if helm_containerd2.run("status", RELEASE, "-n", NAMESPACE, check=False).returncode == 0:
            helm_containerd2.uninstall()


def test_the_node_runs_containerd_2_without_device_ownership(cluster_containerd2: Cluster) -> None:
    node = cluster_containerd2.node
    assert node.get()["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.4.2")
    config = (node.dir / "containerd" / "config.toml").read_text()
    assert "device_ownership_from_security_context = false" in config


def test_the_daemon_writes_the_spec_into_the_nodes_cdi_dir(cluster_containerd2: Cluster, installed: None) -> None:
    pod = wait_plugin_ready(cluster_containerd2)
    cluster_containerd2.node.wait_resource(RESOURCE, "4096")
    spec = wait_until("the CDI spec on the node", lambda: node_spec(cluster_containerd2), 60)
    print(f"{SPEC_FILE} on the node: {json.dumps(spec)}")
    assert spec["kind"] == RESOURCE
    (device,) = spec["devices"]
    assert device["name"] == "kvm"
    (node,) = device["containerEdits"]["deviceNodes"]
    assert (node["path"], node["type"], node["major"], node["minor"]) == ("/dev/kvm", "c", 10, 232)
    assert (node["fileMode"], node["permissions"]) == (0o666, "rw")
    written = sample(
        metrics(cluster_containerd2, pod),
        "ate_devplugin_cdi_spec_updates_total",
        resource_name=RESOURCE,
        action="write",
        result="success",
    )
    assert written == 1
    tun = wait_until("the tun CDI spec on the node", lambda: node_spec(cluster_containerd2, TUN_SPEC_FILE), 60)
    (node,) = tun["devices"][0]["containerEdits"]["deviceNodes"]
    assert (node["path"], node["major"], node["minor"], node["fileMode"]) == ("/dev/net/tun", 10, 200, 0o666)


def test_qemu_boots_through_the_cdi_specs(cluster_containerd2: Cluster, installed: None) -> None:
    """The worker as shipped (QEMU as uid 10001, no capability, no privilege escalation):
    the Allocate answers name only ``ate.dev/kvm=kvm`` and ``ate.dev/tun=tun``, so the nodes
    it gets are the specs'."""
    run = run_pod(cluster_containerd2, worker("cdi-qemu"))
    booted_as_shipped(run, cluster_containerd2.cgroup)
    nodes = {path: found.split() for path, found in run.nodes().items()}
    assert (nodes["/dev/kvm"][0], nodes["/dev/kvm"][3]) == ("crw-rw-rw-", "a:e8"), nodes
    assert (nodes["/dev/net/tun"][0], nodes["/dev/net/tun"][3]) == ("crw-rw-rw-", "a:c8"), nodes


def test_qemu_without_the_request_has_no_kvm(cluster_containerd2: Cluster, installed: None) -> None:
    run = run_pod(cluster_containerd2, worker("cdi-no-kvm", kvm=False))
    print(f"without ate.dev/kvm: exit {run.exit_code}; {run.logs.strip()}")
    assert run.exit_code == 1, run.logs
    assert NO_KVM in run.logs
    assert "No such file or directory" in run.nodes()["/dev/kvm"]


def test_helm_uninstall_removes_the_spec(cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None) -> None:
    assert node_spec(cluster_containerd2) is not None
    helm_containerd2.uninstall()
    wait_until("the CDI spec removed", lambda: node_spec(cluster_containerd2) is None, 120)
    assert cluster_containerd2.node.run(["ls", "-A", CDI_SPEC_DIR]).stdout.strip() == ""


def test_both_keeps_a_runtime_without_cdi_working(cluster: Cluster, helm: Helm) -> None:
    """``allocate: both`` on Debian's containerd 1.6 (cgroup v1), which has no CDI: the
    worker gets /dev/kvm and /dev/net/tun from the device specs (the cluster's device
    ownership makes them the pod user's), and the CDI names beside them are ignored, not
    an error."""
    both = [{**r, "allocate": "both"} for r in CDI_RESOURCES]
    helm.install("--set-json", f"deviceConfig.resources={json.dumps(both)}")
    try:
        wait_plugin_ready(cluster)
        cluster.node.wait_resource(RESOURCE, "4096")
        assert node_spec(cluster) is not None  # written; this runtime does not read it
        run = run_pod(cluster, worker("both-qemu"))
        booted_as_shipped(run, cluster.cgroup)
        assert run.nodes()["/dev/kvm"].startswith("crw------- 10001 10001 a:e8"), run.nodes()
    finally:
        helm.uninstall()
    # As the user's path expects the node: no plugin, nothing allocatable.
    cluster.node.wait_resource(RESOURCE, "0")
    wait_until("the CDI spec removed", lambda: node_spec(cluster) is None, 120)
