"""Where the plugin runs: one DaemonSet and ConfigMap per node pool, the nodes left out by
default (virtual nodes) or required (node-feature-discovery's label), and a pod template
that a chart upgrade alone does not change."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.chart import CHART, CI_VALUES, Helm, HelmError, Manifest, by_kind, daemonsets, one, the_daemons

POOLS = CHART / "ci" / "pools-values.yaml"
VIRTUAL_NODES = [
    {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]},
    {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate"]},
]
KVM_LABEL = {"key": "ate.dev.feature.node.kubernetes.io/kvm", "operator": "In", "values": ["true"]}


def config_of(docs: list[Manifest], ds: Manifest) -> Any:
    """The daemon config a DaemonSet mounts."""
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    (cm,) = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]]
    return yaml.safe_load(cm["data"]["config.yaml"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def required_terms(ds: Manifest) -> list[dict[str, Any]]:
    affinity = ds["spec"]["template"]["spec"].get("affinity", {})
    terms: list[dict[str, Any]] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


# --- pools --------------------------------------------------------------------------------


def test_two_pools_render_two_daemonsets_with_their_own_configs(helm: Helm) -> None:
    values = yaml.safe_load(POOLS.read_text())
    docs = helm.template([POOLS])
    by_pool = {ds["metadata"]["labels"]["ate.dev/pool"]: ds for ds in daemonsets(docs)}
    assert set(by_pool) == set(values["pools"]) == {"vm", "nfv"}
    assert {n: ds["metadata"]["name"] for n, ds in by_pool.items()} == {"vm": "ate-ate-devplugin-vm",
                                                                        "nfv": "ate-ate-devplugin-nfv"}  # fmt: skip
    for name, ds in by_pool.items():
        pool = values["pools"][name]
        pod = ds["spec"]["template"]
        assert config_of(docs, ds)["resources"] == pool["deviceConfig"]["resources"]
        assert pod["spec"]["nodeSelector"] == pool["nodeSelector"]
        # Each DaemonSet selects its own pods only.
        for other_name, other in by_pool.items():
            assert selects(ds["spec"]["selector"]["matchLabels"], other["spec"]["template"]["metadata"]["labels"]) is (
                other_name == name
            )
    # What a pool does not set comes from the top level; what it sets replaces it whole.
    assert by_pool["vm"]["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert by_pool["nfv"]["spec"]["template"]["spec"]["tolerations"] == values["pools"]["nfv"]["tolerations"]
    assert (
        by_pool["nfv"]["spec"]["template"]["spec"]["containers"][0]["resources"] == values["pools"]["nfv"]["resources"]
    )
    assert "checksum/config" in by_pool["nfv"]["spec"]["template"]["metadata"]["annotations"]
    assert "annotations" not in by_pool["vm"]["spec"]["template"]["metadata"]
    # One Service, NetworkPolicy for the pods of every pool.
    service = one(docs, "Service")
    policy = the_daemons(docs, "NetworkPolicy")
    for ds in by_pool.values():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert selects(service["spec"]["selector"], labels)
        assert selects(policy["spec"]["podSelector"]["matchLabels"], labels)


def test_without_pools_names_and_selector_stay_as_they_were(any_helm: Helm) -> None:
    """The single DaemonSet keeps the name and the (immutable) selector of earlier releases."""
    docs = any_helm.template()
    (ds,) = daemonsets(docs)
    assert ds["metadata"]["name"] == "ate-ate-devplugin"
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "ate-devplugin",
        "app.kubernetes.io/instance": "ate",
    }
    assert "ate.dev/pool" not in ds["spec"]["template"]["metadata"]["labels"]
    assert config_of(docs, ds)["resources"][0]["name"] == "ate.dev/kvm"


def test_device_classes_cover_every_pool(any_helm: Helm) -> None:
    docs = any_helm.template([POOLS], sets=["dra.mode=both"])
    assert sorted(c["metadata"]["name"] for c in by_kind(docs, "DeviceClass")) == ["kvm.ate.dev", "tun.ate.dev"]


@pytest.mark.parametrize(
    ("values", "fragments"),
    [
        ("pools: {a: {image: {tag: x}}}", ["/pools/a", "image"]),
        ("pools: {Big_Pool: {}}", ["/pools", "Big_Pool"]),
        (
            "pools: {a: {deviceConfig: {resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 0}]}}}",
            ["/pools/a/deviceConfig/resources/0/units"],
        ),
        (
            "pools: {a: {deviceConfig: {resources: [{name: ate.dev/kvm, devices: [/dev/kvm]},"
            " {name: ate.dev/kvm, devices: [/dev/tun]}]}}}",
            ["deviceConfig.resources[1].name: 'ate.dev/kvm' collides with resources[0]"],
        ),
    ],
)
def test_a_bad_pool_is_refused(
    any_helm: Helm, write_values: Callable[[str], Path], values: str, fragments: list[str]
) -> None:
    with pytest.raises(HelmError) as err:
        any_helm.template([write_values(values)])
    for fragment in fragments:
        assert fragment in str(err.value)


# --- which nodes ----------------------------------------------------------------------------


def test_virtual_nodes_are_left_out_by_default(helm: Helm) -> None:
    (ds,) = daemonsets(helm.template())
    assert required_terms(ds) == [{"matchExpressions": VIRTUAL_NODES}]
    (ds,) = daemonsets(helm.template(sets=["nodeRequirements=null"]))
    assert "affinity" not in ds["spec"]["template"]["spec"]


def test_requirements_join_every_term_of_the_users_affinity(any_helm: Helm) -> None:
    path = CHART / "ci" / "node-feature-values.yaml"
    values = yaml.safe_load(path.read_text())
    docs = any_helm.template([path])
    (ds,) = daemonsets(docs)
    own = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms = required_terms(ds)
    assert len(terms) == len(own) == 2
    for got, mine in zip(terms, own, strict=True):
        # A term is an AND: the user's conditions, then no virtual node, then KVM found.
        assert got["matchExpressions"] == [*mine.get("matchExpressions", []), *VIRTUAL_NODES, KVM_LABEL]
        assert got.get("matchFields") == mine.get("matchFields")


def test_node_feature_rule_labels_what_the_pods_require(any_helm: Helm) -> None:
    assert not by_kind(any_helm.template(), "NodeFeatureRule")
    docs = any_helm.template(sets=["nodeFeatureRule.enabled=true"])
    rule = one(docs, "NodeFeatureRule")
    assert rule["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert "namespace" not in rule["metadata"], "NodeFeatureRule is cluster-scoped"
    (spec,) = rule["spec"]["rules"]
    assert spec["labels"] == {KVM_LABEL["key"]: "true"}
    modules = [
        name for term in spec["matchAny"] for f in term["matchFeatures"] for name in f["matchExpressions"]
    ]  # fmt: skip
    assert modules == ["kvm_intel", "kvm_amd"]
    (ds,) = daemonsets(docs)
    assert required_terms(ds) == [{"matchExpressions": [*VIRTUAL_NODES, KVM_LABEL]}]


# --- a chart upgrade alone restarts no pod ------------------------------------------------------


def bumped_chart(tmp_path: Path, version: str) -> Path:
    """A copy of the chart with another chart version (appVersion, so the image, unchanged)."""
    copy = tmp_path / "ate-devplugin"
    shutil.copytree(CHART, copy)
    meta = copy / "Chart.yaml"
    text = meta.read_text()
    current = yaml.safe_load(text)["version"]
    meta.write_text(text.replace(f"\nversion: {current}\n", f"\nversion: {version}\n"))
    assert yaml.safe_load(meta.read_text())["version"] == version
    return copy


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_a_new_chart_version_leaves_the_pod_template_alone(helm: Helm, tmp_path: Path, values: Path) -> None:
    old = {d["metadata"]["name"]: d for d in daemonsets(helm.template([values]))}
    new = {d["metadata"]["name"]: d for d in daemonsets(helm.template([values], chart=bumped_chart(tmp_path, "9.9.9")))}
    assert set(new) == set(old)
    for name, ds in new.items():
        assert ds["spec"]["template"] == old[name]["spec"]["template"], f"{name}: the pods would restart"
        # The objects themselves do say the new version: the comparison can see a change.
        assert ds["metadata"]["labels"]["helm.sh/chart"] == "ate-devplugin-9.9.9"
        assert old[name]["metadata"]["labels"]["helm.sh/chart"] != "ate-devplugin-9.9.9"


def test_pod_labels_are_the_selector_and_stable_ones(any_helm: Helm) -> None:
    (ds,) = daemonsets(any_helm.template(sets=["podLabels.team=vm", "commonLabels.owner=platform"]))
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "ate-devplugin",
        "app.kubernetes.io/instance": "ate",
        "app.kubernetes.io/component": "device-plugin",
        "app.kubernetes.io/part-of": "ate-devplugin",
        "app.kubernetes.io/managed-by": "Helm",
        "owner": "platform",
        "team": "vm",
    }
