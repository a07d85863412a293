"""Fixtures for the chart tests: real helm (v3 and v4), checkov, kubernetes-validate and
the prometheus-operator CRD schemas.

Tools and where they are looked for (a missing one skips its tests with the install
command in the reason; under ``CI=true`` it fails instead, see tests/harness/require.py):

* helm v3 / v4: ``$HELM_V3`` / ``$HELM_V4``, else ``build/bin/helm-v3`` / ``build/bin/helm-v4``
  (``tools/build-helm.sh``, from the Go module in tools/helm).
* checkov: ``$CHECKOV``, else ``build/checkov-venv/bin/checkov``, else ``checkov`` on PATH
  (``tools/install-test-tools.sh`` puts it in its own venv: its pins clash with ours).
* kubernetes-validate: the Python package (the dev extra: ``pip install -e ".[dev]"``).
* go: the prometheus-operator module (CRD YAMLs) comes through the Go module proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.chart import (
    CI_VALUES,
    HELM_MAJORS,
    MONITORING_KINDS,
    REPO,
    Helm,
    Manifest,
    helm_path,
    prometheus_operator_crds,
)
from tests.harness.require import missing_tool


@pytest.fixture(scope="session")
def helms() -> dict[str, Helm]:
    """Every helm major version that is built (may be empty)."""
    return {m: Helm(m, p) for m in HELM_MAJORS if (p := helm_path(m))}


@pytest.fixture(params=HELM_MAJORS)
def helm(request: pytest.FixtureRequest, helms: dict[str, Helm]) -> Helm:
    major: str = request.param
    if major not in helms:
        missing_tool(f"helm {major} (build/bin/helm-{major} or $HELM_{major.upper()})", "tools/build-helm.sh")
    return helms[major]


@pytest.fixture
def any_helm(helms: dict[str, Helm]) -> Helm:
    """One helm (v4 preferred) for tests whose result does not depend on the version."""
    for major in reversed(HELM_MAJORS):
        if major in helms:
            return helms[major]
    missing_tool("helm (build/bin/helm-v3 or helm-v4)", "tools/build-helm.sh")


@pytest.fixture
def helm_v4(helms: dict[str, Helm]) -> Helm:
    if "v4" not in helms:
        missing_tool("helm v4 (build/bin/helm-v4 or $HELM_V4)", "tools/build-helm.sh v4")
    return helms["v4"]


# --- kubernetes-validate ----------------------------------------------------------------


@pytest.fixture(scope="session")
def k8s_validate() -> Callable[[Manifest, str], None]:
    try:
        import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed marker
    except ImportError:
        missing_tool("the kubernetes-validate Python package", 'pip install -e ".[dev]"')

    # Validation is a pure function of the object and the release: an object rendered alike by
    # helm v3 and v4, or by several ci files (most of them are), is validated once per release.
    valid: set[tuple[str, str]] = set()

    def validate(manifest: Manifest, version: str) -> None:
        key = (version, json.dumps(manifest, sort_keys=True))
        if key not in valid:
            kubernetes_validate.validate(manifest, version, strict=True)
            valid.add(key)

    return validate


# --- prometheus-operator CRDs -----------------------------------------------------------


def _strict(node: Any) -> Any:
    """A CRD's structural schema as JSON Schema that also refuses unknown fields (the API
    server prunes them silently, which hides typos such as `relabellings`)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="session")
def monitoring_schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """kind -> JSON Schema of monitoring.coreos.com/v1, from the prometheus-operator
    module's CRD YAMLs (example/prometheus-operator-crd/), fetched with `go mod download`."""
    try:
        crd_dir = prometheus_operator_crds(tmp_path_factory.mktemp("gomod"))
    except LookupError as exc:
        missing_tool(str(exc), "the Go toolchain (https://go.dev/dl)")
    schemas: dict[str, Any] = {}
    for kind, filename in MONITORING_KINDS.items():
        crd = yaml.safe_load((crd_dir / filename).read_text())
        assert crd["spec"]["names"]["kind"] == kind
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schemas[kind] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


# --- checkov ----------------------------------------------------------------------------


def checkov_path() -> Path | None:
    for candidate in (
        os.environ.get("CHECKOV"),
        str(REPO / "build" / "checkov-venv" / "bin" / "checkov"),
        shutil.which("checkov"),
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def checkov() -> Callable[[Path], dict[str, Any]]:
    """Runs checkov's kubernetes checks on a folder; returns its JSON report."""
    path = checkov_path()
    if path is None:
        missing_tool(
            "checkov ($CHECKOV, build/checkov-venv/bin/checkov or PATH)",
            "tools/install-test-tools.sh (python3 -m venv build/checkov-venv && build/checkov-venv/bin/pip "
            "install checkov==3.3.30)",
        )

    def run(folder: Path) -> dict[str, Any]:
        out = subprocess.run(
            [str(path), "--directory", str(folder), "--framework", "kubernetes", "--output", "json",
             "--skip-download"],
            capture_output=True, text=True, timeout=600, check=False,
            # No calls home (the platform API is unreachable here anyway).
            env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
        )  # fmt: skip
        assert out.stdout.strip(), f"checkov printed nothing (rc {out.returncode}): {out.stderr[-2000:]}"
        report = json.loads(out.stdout)
        reports = report if isinstance(report, list) else [report]
        (k8s,) = [r for r in reports if r.get("check_type") == "kubernetes"]
        result: dict[str, Any] = k8s
        return result

    return run


# --- rendered manifests -----------------------------------------------------------------


@pytest.fixture(params=CI_VALUES, ids=[p.stem for p in CI_VALUES])
def ci_values(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


@pytest.fixture
def write_values(tmp_path: Path) -> Callable[[str], Path]:
    """Writes a values file (YAML text) into the test's tmp dir and returns its path."""
    count = 0

    def write(text: str) -> Path:
        nonlocal count
        count += 1
        path = tmp_path / f"values-{count}.yaml"
        path.write_text(text)
        return path

    return write
