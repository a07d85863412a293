"""CDI on a real node: the one-node cluster on containerd 2, the chart with a resource that
answers Allocate with its CDI device name, and a non-root pod that opens /dev/kvm because
the daemon's CDI spec gives the node mode 0666 in the container, with containerd's
``device_ownership_from_security_context`` off and no other node-level setting.

The tests run in file order and share one release, removed by the uninstall test.
"""

from __future__ import annotations

from tests.e2e.cluster import NODE, Cluster


def test_the_node_runs_containerd_2(cluster_containerd2: Cluster) -> None:
    node = cluster_containerd2.get_json("node", NODE)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.4.2")
