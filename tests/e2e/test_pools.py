"""The chart's node pools on the two-node Kubernetes 1.37 cluster: chart/ci/pools-values.yaml
as shipped, the first node labelled for pool ``vm`` and the second for ``nfv``. Each pool's
DaemonSet runs one plugin pod, on its own node only, serving its own ConfigMap: the nodes
offer what their pool's config says, and nothing of the other pool's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.e2e.cluster import Cluster, Node
from tests.e2e.userpath import CHART, NAMESPACE, RELEASE, Helm, is_ready, plugin_pods

POOL = "ate.dev/pool"
POOLS_VALUES = CHART / "ci" / "pools-values.yaml"
# What each pool's config offers (pools-values.yaml): resource -> units.
OFFERS = {
    pool: {r["name"]: str(r["units"]) for r in spec["deviceConfig"]["resources"]}
    for pool, spec in yaml.safe_load(POOLS_VALUES.read_text())["pools"].items()
}


@pytest.fixture(scope="module")
def pools(cluster_137: Cluster, helm_137: Helm) -> Iterator[dict[str, Node]]:
    """{pool: its node}, the release installed with the pools file; labels as they were after."""
    first, second = cluster_137.nodes
    by_pool = {"vm": first, "nfv": second}
    before = {node.name: node.get()["metadata"].get("labels", {}).get(POOL) for node in by_pool.values()}
    for pool, node in by_pool.items():
        node.label({POOL: pool})
    try:
        helm_137.install("-f", str(POOLS_VALUES))
        yield by_pool
    finally:
        helm_137.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m", check=False)
        for node in by_pool.values():
            node.label({POOL: before[node.name]})


def test_each_pool_runs_one_plugin_pod_on_its_own_node(cluster_137: Cluster, pools: dict[str, Node]) -> None:
    daemonsets = cluster_137.get_json("daemonsets", "-n", NAMESPACE)["items"]
    # Each pool's daemon, and its KVM prober (on by default).
    assert sorted(d["metadata"]["name"] for d in daemonsets) == sorted(
        name for pool in pools for name in (f"{RELEASE}-{pool}", f"{RELEASE}-{pool}-kvm-prober")
    )
    for pool, node in pools.items():
        cluster_137.kubectl("-n", NAMESPACE, "rollout", "status", f"daemonset/{RELEASE}-{pool}", "--timeout=240s",
                            timeout=270)  # fmt: skip
        [pod] = plugin_pods(cluster_137, node)
        assert is_ready(pod)
        assert pod["metadata"]["ownerReferences"][0]["name"] == f"{RELEASE}-{pool}"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == f"{RELEASE}-{pool}"
    assert len(plugin_pods(cluster_137)) == len(pools)  # none on the other pool's node


def test_each_node_offers_what_its_pool_config_says(pools: dict[str, Node]) -> None:
    resources = {r for offer in OFFERS.values() for r in offer}
    for pool, node in pools.items():
        for resource, units in OFFERS[pool].items():
            node.wait_resource(resource, units)
        for other in resources - set(OFFERS[pool]):
            assert node.resource("allocatable", other) in (None, "0"), f"{node.name} offers {other}"
