"""The chart with real helm v3 and v4: lint --strict, template for every ci/ values file,
both versions agreeing, names within limits, and the chart self-contained when packaged."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import yaml

from tests.harness.chart import CHART, CI_VALUES, NAMESPACE, Helm, by_kind, daemonsets, the_daemons
from tests.harness.require import require

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_helm_versions(helm: Helm) -> None:
    out = helm.run("version", "--short")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith({"v3": "v3.22.", "v4": "v4.3."}[helm.major]), out.stdout


def test_lint_strict_defaults(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout
    assert "[ERROR]" not in out.stdout


def test_lint_strict_ci_values(helm: Helm, ci_values: Path) -> None:
    out = helm.run("lint", "--strict", str(CHART), "--values", str(ci_values))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout
    assert "[ERROR]" not in out.stdout


# The DRA driver's RBAC, DeviceClasses and admission policy; node-feature-discovery's rule.
CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding", "NodeFeatureRule",
}  # fmt: skip


def test_template_ci_values(helm: Helm, ci_values: Path) -> None:
    docs = helm.template([ci_values])
    kinds = [d["kind"] for d in docs]
    values = yaml.safe_load(ci_values.read_text()) or {}
    pools = values.get("pools", {}) or {"": {}}
    probed = values.get("kvmProbe", {}).get("enabled", True)
    # The prober's DaemonSet beside each daemon's whose pool (key by key) keeps kvmProbe.enabled.
    probers = sum(1 for pool in pools.values() if pool.get("kvmProbe", {}).get("enabled", probed))
    assert kinds.count("DaemonSet") == len(pools) + probers
    for doc in docs:
        assert doc["apiVersion"], doc
        assert doc["metadata"]["name"], doc
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], doc
            continue
        assert doc["metadata"].get("namespace"), f"{doc['kind']} {doc['metadata']['name']} has no namespace"


def test_ci_files_cover_every_toggle() -> None:
    """Each boolean switch in values.yaml is flipped from its default by some ci/ file."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    # Security contexts hold settings, not switches: the schema refuses their other value.
    for fixed in ("securityContext", "podSecurityContext"):
        defaults.pop(fixed)
    defaults["kvmProbe"].pop("podSecurityContext")
    defaults["test"].pop("podSecurityContext")

    def toggles(node: object, prefix: str = "") -> dict[str, bool]:
        found: dict[str, bool] = {}
        if isinstance(node, dict):
            for k, v in node.items():
                path = f"{prefix}.{k}" if prefix else k
                if isinstance(v, bool):
                    found[path] = v
                else:
                    found.update(toggles(v, path))
        return found

    def lookup(node: object, path: str) -> object:
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    ci_docs = [yaml.safe_load(p.read_text()) or {} for p in CI_VALUES]
    not_flipped = [
        path for path, default in toggles(defaults).items()
        if not any(lookup(doc, path) is (not default) for doc in ci_docs)
    ]  # fmt: skip
    assert not not_flipped, f"no ci/ values file flips: {not_flipped}"


def test_v3_and_v4_render_the_same(helms: dict[str, Helm], ci_values: Path) -> None:
    require(len(helms) == 2, "needs both helm v3 and v4 (tools/build-helm.sh)")
    v3, v4 = helms["v3"].template([ci_values]), helms["v4"].template([ci_values])
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(v3, key=key) == sorted(v4, key=key)


def test_names_and_labels_within_limits(helm: Helm, ci_values: Path) -> None:
    # The longest release name helm accepts is 53 characters.
    docs = helm.template([ci_values], release="r" * 53)
    for doc in docs:
        name = doc["metadata"]["name"]
        assert len(name) <= 63, f"{doc['kind']} name {name!r} is longer than 63"
        # A DeviceClass is named after its resource: a DNS subdomain.
        parts = name.split(".") if doc["kind"] == "DeviceClass" else [name]
        assert all(DNS_LABEL.match(p) for p in parts), f"{doc['kind']} name {name!r} is not a DNS label"
        for key, value in doc["metadata"].get("labels", {}).items():
            assert len(str(value)) <= 63, f"label {key}={value!r} is longer than 63"
            assert LABEL_VALUE.match(str(value)), f"label {key}={value!r} is not a valid label value"
    for ds in daemonsets(docs):
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_standard_labels(any_helm: Helm) -> None:
    for doc in any_helm.template():
        labels = doc["metadata"]["labels"]
        for key in (
            "helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
            "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
        ):  # fmt: skip
            assert key in labels, f"{doc['kind']} lacks label {key}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_fullname_uses_release_when_it_contains_chart_name(any_helm: Helm) -> None:
    docs = any_helm.template(release="ate-devplugin-prod")
    assert the_daemons(docs, "DaemonSet")["metadata"]["name"] == "ate-devplugin-prod"
    docs = any_helm.template(release="x", sets=["nameOverride=kvm-plugin"])
    assert the_daemons(docs, "DaemonSet")["metadata"]["name"] == "x-kvm-plugin"


def test_namespace_override(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["namespaceOverride=node-devices"])
    assert {d["metadata"]["namespace"] for d in docs} == {"node-devices"}
    assert {d["metadata"]["namespace"] for d in any_helm.template()} == {NAMESPACE}


def test_packaged_chart_is_self_contained(helm: Helm, tmp_path: Path) -> None:
    out = helm.run("package", str(CHART), "--destination", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (tgz,) = tmp_path.glob("ate-devplugin-*.tgz")
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    for path in sorted((CHART / "files").rglob("*")):
        if path.is_file():
            assert f"ate-devplugin/{path.relative_to(CHART)}" in names, f"{path} not packaged"
    assert not any(n.startswith("ate-devplugin/ci/") for n in names), "ci/ should not be packaged"
    # The packaged chart renders exactly like the folder.
    values = [p for p in CI_VALUES if p.stem.startswith("servicemonitor")]
    assert helm.template(values, chart=tgz) == helm.template(values)
    assert by_kind(helm.template(values, chart=tgz), "PrometheusRule")


def test_kube_version_constraint(helm: Helm) -> None:
    # The oldest supported release, a managed provider's build of it, later ones.
    for version in ("1.29.0", "1.29.8-eks-1a2b3c4", "1.32.2", "1.35.0", "1.37.1"):
        out = helm.run("template", "x", str(CHART), "--kube-version", version)
        assert out.returncode == 0, f"{version}: {out.stderr}"
    out = helm.run("template", "x", str(CHART), "--kube-version", "1.28.15")
    assert out.returncode != 0
    assert "kubeVersion" in out.stderr or "incompatible" in out.stderr.lower(), out.stderr
