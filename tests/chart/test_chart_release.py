"""What a release publishes, without publishing: Chart.yaml's metadata and Artifact Hub
annotations agree with the CHANGELOG and the default image, the install commands of
chart/README.md name this version, and tools/release.sh refuses a version that is not the
checkout's. (tests/e2e/test_user_path.py publishes to a real registry and runs the commands.)

Where the project lives is said once, by the chart's ``home`` value: what the chart renders
(image, runbook and documentation links) comes from it, tools/release.sh derives its
registry from it, and the texts that cannot be templated (Chart.yaml, the install commands,
the plain alert rules) must name the same home."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.harness.chart import CHART, REPO, Helm, daemonsets, doc_block

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
HOME = yaml.safe_load((CHART / "values.yaml").read_text())["home"]
OWNER = HOME.removeprefix("https://github.com/").split("/")[0].lower()
REGISTRY = f"ghcr.io/{OWNER}"  # GitHub's registry of the home's owner
OCI_CHART = f"oci://{REGISTRY}/charts/ate-devplugin"


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
    assert HOME.startswith("https://github.com/"), "the defaults below are GitHub's"
    assert CHART_YAML["home"] == HOME, "Chart.yaml's home is values.yaml's"
    assert CHART_YAML["sources"] == [HOME, f"{HOME}/pkgs/container/ate-devplugin"]
    assert [m["url"] for m in CHART_YAML["maintainers"]] == [HOME]
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
    assert image["image"] == f"{REGISTRY}/ate-devplugin:{CHART_YAML['appVersion']}"


def test_the_documented_install_is_this_version() -> None:
    version = CHART_YAML["version"]
    install = doc_block("install")
    assert f"helm install ate-devplugin {OCI_CHART} --version {version}" in " ".join(install.split())
    assert " ".join(install.split()) == " ".join(doc_block("install", REPO / "README.md").split())
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


def test_release_publishes_where_home_says() -> None:
    """tools/release.sh's default registry is the home's owner's on ghcr.io; the install
    command it prints is the documented one."""
    version = CHART_YAML["version"]
    out = subprocess.run(
        [str(REPO / "tools" / "release.sh"), "--where", version],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HELM": "/bin/false"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    where = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    print(where)
    assert where["image"] == f"{REGISTRY}/ate-devplugin:{version}"
    assert where["chart"] == f"{OCI_CHART} {version}"
    assert " ".join(where["install"].split()) in " ".join(doc_block("install").split()).replace(" \\", "")


def test_the_alert_rules_link_the_homes_runbook() -> None:
    """chart/files/alerts.yaml is read by promtool as it is: its runbook links are
    written out, and must be the ones the chart renders from home, at the chart's version."""
    doc = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert rules
    runbook = f"{HOME}/blob/v{CHART_YAML['version']}/docs/runbook.md"
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{runbook}#{rule['alert'].lower()}"


def test_another_home_moves_every_name_the_chart_renders(helm_v4: Helm) -> None:
    """An organisation that publishes the project sets home alone: the image, the runbook
    links, the documentation links of NOTES and of the DeviceClass all follow, and nothing
    rendered names the placeholder's home or registry any more."""
    home = "https://github.com/Acme-Platform/ate-devplugin"
    sets = ["--set", f"home={home}", "--set", "prometheusRule.enabled=true", "--set", "forceMonitoringApi=true",
            "--set", "dra.mode=both"]  # fmt: skip
    # The manifests on 1.36 (DeviceClass comments name the docs there), then NOTES.
    rendered = helm_v4.run("template", "ate-devplugin", str(CHART), "-n", "ate-system", "--set",
                           "kubeVersionOverride=1.36", *sets)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    tag = f"v{CHART_YAML['version']}"
    assert f"{home}/blob/{tag}/docs/dra.md" in rendered.stdout
    out = helm_v4.run("install", "ate-devplugin", str(CHART), "--dry-run=client", "-n", "ate-system", *sets)
    assert out.returncode == 0, out.stderr
    for text in (rendered.stdout, out.stdout):
        assert HOME not in text
        assert f"{REGISTRY}/" not in text
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (ds,) = daemonsets(docs)
    version = CHART_YAML["appVersion"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/acme-platform/ate-devplugin:{version}"
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    urls = {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert urls
    assert all(u.startswith(f"{home}/blob/{tag}/docs/runbook.md#atedevplugin") for u in urls)
    notes = out.stdout.split("NOTES:", 1)[1]
    assert f"{home}/blob/{tag}/docs/dra.md" in notes
    assert f"{home}/blob/{tag}/docs/non-root-consumers.md" in notes


def test_a_home_off_github_needs_the_image_named(helm_v4: Helm) -> None:
    home = ("--set", "home=https://git.example.com/platform/ate-devplugin")
    out = helm_v4.run("template", "ate", str(CHART), *home)
    assert out.returncode != 0
    assert "image.repository is empty and home" in out.stderr
    image = ("--set", "image.registry=registry.example.com", "--set", "image.repository=platform/ate-devplugin")
    out = helm_v4.run("template", "ate", str(CHART), *home, *image)
    assert out.returncode == 0, out.stderr
    assert "registry.example.com/platform/ate-devplugin:" in out.stdout
