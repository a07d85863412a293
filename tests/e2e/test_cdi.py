"""CDI on a real node: the one-node cluster on containerd 2, the chart with a resource that
answers Allocate with its CDI device name only, and a non-root pod that opens /dev/kvm
because the daemon's CDI spec gives the node mode 0666 in the container: containerd's
``device_ownership_from_security_context`` is off and nothing else is set on the node.

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
    Helm,
    consumer_pod,
    kvm_rule,
    metrics,
    ran_vm,
    run_consumer,
    sample,
    wait_plugin_ready,
)

SPEC_FILE = f"{CDI_SPEC_DIR}/ate.dev-kvm.json"
CDI_RESOURCES = [{"name": RESOURCE, "devices": ["/dev/kvm"], "allocate": "cdi", "cdi": {"file_mode": "0666"}}]


def node_spec(cluster: Cluster) -> dict[str, Any] | None:
    """The CDI spec file on the node (in its mount namespace, where containerd reads it), or None."""
    out = cluster.node.run(["cat", SPEC_FILE], check=False)
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


def test_a_non_root_pod_opens_kvm_through_the_cdi_spec(cluster_containerd2: Cluster, installed: None) -> None:
    """The example pod as shipped (uid 10001, no capability, no privilege escalation): its
    Allocate answer names only ``ate.dev/kvm=kvm``, so the node it gets is the spec's."""
    result = run_consumer(cluster_containerd2, consumer_pod("cdi-kvm"))
    print(f"non-root pod on containerd 2 with CDI: {result}")
    assert result["phase"] == "Succeeded", result
    assert result["uid"] == 10001
    assert result["cap_eff"] == "0000000000000000"
    mode, _uid, _gid, major, minor = result["node"]
    assert (mode, major, minor) == ("crw-rw-rw-", 10, 232)
    assert kvm_rule(result["devices_list"]) == ["c 10:232 rw"]
    assert ran_vm(result), result


def test_a_pod_without_the_request_sees_no_kvm(cluster_containerd2: Cluster, installed: None) -> None:
    result = run_consumer(cluster_containerd2, consumer_pod("cdi-none", request=False))
    assert result["phase"] == "Succeeded", result
    assert str(result["node"]).startswith("FileNotFoundError"), result
    assert result["vm_error"] == result["node"], result  # no VM either
    assert kvm_rule(result["devices_list"]) == []


def test_helm_uninstall_removes_the_spec(cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None) -> None:
    assert node_spec(cluster_containerd2) is not None
    helm_containerd2.uninstall()
    wait_until("the CDI spec removed", lambda: node_spec(cluster_containerd2) is None, 120)
    assert cluster_containerd2.node.run(["ls", "-A", CDI_SPEC_DIR]).stdout.strip() == ""


def test_both_keeps_a_runtime_without_cdi_working(cluster: Cluster, helm: Helm) -> None:
    """``allocate: both`` on Debian's containerd 1.6, which has no CDI: the pod gets
    /dev/kvm from the device specs (the cluster's device ownership makes it the pod
    user's), and the CDI name beside them is ignored, not an error."""
    both = [{**CDI_RESOURCES[0], "allocate": "both"}]
    helm.install("--set-json", f"deviceConfig.resources={json.dumps(both)}")
    try:
        wait_plugin_ready(cluster)
        cluster.node.wait_resource(RESOURCE, "4096")
        assert node_spec(cluster) is not None  # written; this runtime does not read it
        result = run_consumer(cluster, consumer_pod("both-kvm"))
        print(f"non-root pod on containerd 1.6 with allocate both: {result}")
        assert result["phase"] == "Succeeded", result
        assert ran_vm(result), result
    finally:
        helm.uninstall()
    # As the user's path expects the node: no plugin, nothing allocatable.
    cluster.node.wait_resource(RESOURCE, "0")
    wait_until("the CDI spec removed", lambda: node_spec(cluster) is None, 120)
