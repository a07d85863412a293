"""Constants and helpers shared by the chart tests (fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
HELM_MAJORS = ("v3", "v4")
NAMESPACE = "ate-system"
RELEASE = "ate"
#: An API with its kind: helm's API list names kinds only when it read them from a cluster
#: (install, upgrade, template --validate), which is how the chart tells the cluster's
#: release from the one helm puts in offline (ate-devplugin.clusterKnown).
CLUSTER_API = "apps/v1/DaemonSet"

# The only version of the module the proxy serves here; its CRDs are monitoring.coreos.com/v1.
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
MONITORING_KINDS = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}

Manifest = dict[str, Any]


def prometheus_operator_crds(workdir: Path) -> Path:
    """The prometheus-operator module's CRD YAMLs (example/prometheus-operator-crd/), fetched
    through the Go module proxy with `go mod download` (``workdir``: outside any go.mod).
    Raises LookupError without go, AssertionError when the download fails."""
    go = shutil.which("go")
    if go is None:
        raise LookupError("go (for the prometheus-operator CRDs)")
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION}"],
        capture_output=True, text=True, cwd=workdir, timeout=600, check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"},
    )  # fmt: skip
    assert out.returncode == 0, f"go mod download failed: {out.stderr or out.stdout}"
    return Path(json.loads(out.stdout)["Dir"]) / "example" / "prometheus-operator-crd"


def helm_path(major: str) -> Path | None:
    env = os.environ.get(f"HELM_{major.upper()}")
    candidate = Path(env) if env else REPO / "build" / "bin" / f"helm-{major}"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


@dataclass
class Helm:
    """One real helm binary, with a cache of renders (they are pure functions of their inputs)."""

    major: str
    path: Path
    _cache: dict[tuple[str, ...], str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            # Keep helm away from the user's config, caches and any cluster.
            "HELM_CACHE_HOME": str(REPO / "build" / "helm-home" / "cache"),
            "HELM_CONFIG_HOME": str(REPO / "build" / "helm-home" / "config"),
            "HELM_DATA_HOME": str(REPO / "build" / "helm-home" / "data"),
            "KUBECONFIG": os.devnull,
        }
        return subprocess.run(
            [str(self.path), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )

    def template_text(
        self,
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        api_versions: Sequence[str] = (),
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        chart: Path = CHART,
        kube_version: str | None = None,
        cluster: bool = True,
    ) -> str:
        """``kube_version``: render as helm does against a cluster of that release (its
        version and an API list naming kinds), or with ``cluster=False`` as `helm template
        --kube-version` alone does."""
        args = ["template", release, str(chart), "--namespace", namespace]
        if kube_version:
            args += ["--kube-version", kube_version]
            if cluster:
                args += ["--api-versions", CLUSTER_API]
        for v in values:
            args += ["--values", str(v)]
        for s in sets:
            args += ["--set", s]
        for a in [*api_versions, *(a for v in values for a in declared_api_versions(v))]:
            args += ["--api-versions", a]
        key = tuple(args)
        if key not in self._cache:
            out = self.run(*args)
            if out.returncode != 0:
                raise HelmError(out.stderr.strip())
            self._cache[key] = out.stdout
        return self._cache[key]

    def template(self, *args: Any, **kwargs: Any) -> list[Manifest]:
        docs = yaml.safe_load_all(self.template_text(*args, **kwargs))
        return [d for d in docs if d]


#: The operator's pages that hold the tested commands: the install path, then the chart's reference.
OPERATOR_PAGES = (REPO / "docs" / "install.md", CHART / "README.md")


def doc_block(name: str, doc: Path | None = None) -> str:
    """The shell block after ``<!-- tested: NAME -->`` in ``doc`` (by default the one operator
    page of OPERATOR_PAGES that has it), as a shell reads it (the list item's indentation
    removed): the commands the documentation prints, for the tests that run them."""
    pattern = rf"<!-- tested: {re.escape(name)} -->\n( *)```sh\n(.*?)\n *```"
    pages = [doc] if doc else [p for p in OPERATOR_PAGES if re.search(pattern, p.read_text(), re.DOTALL)]
    assert len(pages) == 1, f"expected one page with a block marked <!-- tested: {name} -->, got {pages}"
    found = re.search(pattern, pages[0].read_text(), re.DOTALL)
    assert found, f"{pages[0].name} has no block marked <!-- tested: {name} -->"
    indent = len(found[1])
    return "\n".join(line[indent:] for line in found[2].splitlines()) + "\n"


def declared_api_versions(values: Path) -> list[str]:
    """The APIs a values file says its render assumes, on a ``# helm-api-versions: A, B``
    line: what a cluster would serve (a ci/ file that renders the ValidatingAdmissionPolicy)."""
    found = re.search(r"^# helm-api-versions: (.+)$", Path(values).read_text(), flags=re.MULTILINE)
    return [a.strip() for a in found[1].split(",")] if found else []


def daemonsets(docs: list[Manifest]) -> list[Manifest]:
    """The daemon's DaemonSets of a render: one, or one per pool (not the KVM prober's)."""
    found = [d for d in by_kind(docs, "DaemonSet") if not is_kvm_prober(d)]
    assert found, "no DaemonSet"
    return found


def the_daemons(docs: list[Manifest], kind: str) -> Manifest:
    """The one object of ``kind`` that is the daemon's (not the KVM prober's, on by default)."""
    return one([d for d in by_kind(docs, kind) if not is_kvm_prober(d)], kind)


def is_kvm_prober(doc: Manifest) -> bool:
    return bool(doc["metadata"]["labels"].get("app.kubernetes.io/component") == "kvm-prober")


def pool_values(values: dict[str, Any], ds: Manifest) -> dict[str, Any]:
    """The values a DaemonSet was rendered from: those of the file, with each key its
    pool (label ate.dev/pool) sets replaced as the chart replaces it."""
    pool = ds["metadata"]["labels"].get("ate.dev/pool")
    return {**values, **values["pools"][pool]} if pool else values


def by_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def oldest_supported_k8s() -> tuple[int, int]:
    """The oldest Kubernetes minor release chart/Chart.yaml's kubeVersion (">=1.MM.0-0") admits."""
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0", yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])
    assert found, "kubeVersion must read >=MAJOR.MINOR.0-0"
    return int(found[1]), int(found[2])


def supported_k8s_versions() -> list[str]:
    """Kubernetes versions from the chart's oldest supported on that the installed
    kubernetes-validate knows, oldest first."""
    oldest = oldest_supported_k8s()
    fallback = [f"{oldest[0]}.{oldest[1]}.0"]
    try:
        from kubernetes_validate.utils import all_versions  # type: ignore[import-untyped]  # no py.typed
    except ImportError:
        return fallback  # the test then skips through the k8s_validate fixture
    return sorted({v for v in all_versions() if _minor(v) >= oldest}, key=_minor) or fallback


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)
