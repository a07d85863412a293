"""The chart runs wherever the image does: tools/release.sh publishes the image for amd64 and
arm64, the chart's Artifact Hub annotation names those platforms, and no default of the
chart (nor of a pool) keeps the plugin to one architecture."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.harness.chart import CHART, REPO, Helm, daemonsets

ARCH_LABEL = "kubernetes.io/arch"


def _released_archs() -> list[str]:
    text = (REPO / "tools" / "release.sh").read_text()
    match = re.search(r'^ARCHS="\$\{ARCHS:-([^}"]+)\}"$', text, flags=re.MULTILINE)
    assert match, "tools/release.sh sets no default ARCHS"
    return match[1].split()


def _mentions(node: Any, key: str) -> bool:
    if isinstance(node, dict):
        return any(k == key or v == key or _mentions(v, key) for k, v in node.items())
    if isinstance(node, list):
        return any(_mentions(v, key) for v in node)
    return False


def test_the_release_builds_amd64_and_arm64() -> None:
    assert _released_archs() == ["amd64", "arm64"]


def test_the_images_annotation_names_every_released_platform() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (image,) = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert image["platforms"] == [f"linux/{arch}" for arch in _released_archs()]


def test_no_default_pins_an_architecture(any_helm: Helm) -> None:
    """Neither the default render nor a pool with the defaults selects on kubernetes.io/arch."""
    renders = [any_helm.template(), any_helm.template(sets=["pools.a.nodeSelector.pool=a"])]
    for docs in renders:
        for ds in daemonsets(docs):
            pod = ds["spec"]["template"]["spec"]
            for field in ("nodeSelector", "affinity"):
                assert not _mentions(pod.get(field), ARCH_LABEL), f"{ds['metadata']['name']}: {field}: {pod[field]}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not _mentions(values, ARCH_LABEL)
