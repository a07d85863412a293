"""What a release publishes, without publishing: Chart.yaml's metadata and Artifact Hub
annotations agree with the CHANGELOG and the default image, the install commands of
chart/README.md name this version, and tools/release.sh refuses a version that is not the
checkout's. (tests/e2e/test_user_path.py publishes to a real registry and runs the commands.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.harness.chart import CHART, REPO, Helm, daemonsets, doc_block

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
OCI_CHART = "oci://ghcr.io/ate-dev/charts/ate-devplugin"


def changelog_entries(version: str) -> list[dict[str, str]]:
    text = (CHART / "CHANGELOG.md").read_text()
    section = re.search(rf"^## {re.escape(version)}\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert section, f"CHANGELOG.md has no '## {version}'"
    return [
        {"kind": kind, "description": description}
        for kind, description in re.findall(r"^- (added|changed|deprecated|removed|fixed|security): (.+)$", section[1],
                                             flags=re.MULTILINE)
    ]  # fmt: skip


def test_metadata_for_a_published_chart() -> None:
    assert CHART_YAML["home"] == "https://github.com/ate-dev/ate-devplugin"
    assert CHART_YAML["home"] in CHART_YAML["sources"]
    assert CHART_YAML["maintainers"]
    assert all(m["name"] for m in CHART_YAML["maintainers"])
    assert CHART_YAML["version"] == CHART_YAML["appVersion"], "chart and image share one version"
    notes = CHART_YAML["annotations"]
    assert notes["artifacthub.io/license"] == "Apache-2.0"
    links = yaml.safe_load(notes["artifacthub.io/links"])
    assert {link["name"] for link in links} >= {"Chart documentation", "Changelog"}
    assert all(link["url"].startswith(CHART_YAML["home"]) for link in links)


def test_changes_annotation_is_the_changelog_entry() -> None:
    changes = yaml.safe_load(CHART_YAML["annotations"]["artifacthub.io/changes"])
    assert changes == changelog_entries(CHART_YAML["version"])
    assert changes


def test_images_annotation_is_the_default_image(any_helm: Helm) -> None:
    (image,) = yaml.safe_load(CHART_YAML["annotations"]["artifacthub.io/images"])
    (ds,) = daemonsets(any_helm.template())
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == image["image"]
    assert image["image"] == f"ghcr.io/ate-dev/ate-devplugin:{CHART_YAML['appVersion']}"


def test_the_documented_install_is_this_version() -> None:
    version = CHART_YAML["version"]
    install = doc_block("install")
    assert f"helm install ate-devplugin {OCI_CHART} --version {version}" in " ".join(install.split())
    stack = doc_block("kube-prometheus-stack")
    assert f"helm upgrade --install ate-devplugin {OCI_CHART} --version {version}" in " ".join(stack.split())
    assert "--set" not in stack, "values in a file, passed again on every upgrade"
    assert "rollout status daemonset/ate-devplugin" in doc_block("verify")


def test_release_refuses_a_version_that_is_not_the_checkouts(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(REPO / "tools" / "release.sh"), "9.9.9"],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HELM": "/bin/false", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"chart/Chart.yaml version is {CHART_YAML['version']}" in out.stderr
    assert "pyproject.toml version is" in out.stderr
