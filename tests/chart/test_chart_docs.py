"""The chart's documentation and its agreement with the daemon: every value documented in
chart/README.md and described in the schema, the rendered config accepted by
`ate-devplugin check-config`, every flag the chart passes known to `ate-devplugin run`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.chart import CHART, Helm, by_kind, daemonsets

# Documented as a whole, not key by key.
WHOLE = {
    "kvmProbe.podSecurityContext", "kvmProbe.resources",
    "deviceConfig.resources", "updateStrategy", "resources", "livenessProbe", "readinessProbe",
    "podSecurityContext", "securityContext", "nodeSelector", "tolerations",
    "test.podSecurityContext", "test.resources",
}  # fmt: skip


def _value_paths(node: dict[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and path not in WHOLE:
            paths += _value_paths(value, path)
        else:
            paths.append(path)
    return paths


def test_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, flags=re.MULTILINE))
    values = set(_value_paths(yaml.safe_load((CHART / "values.yaml").read_text())))
    assert not values - documented, f"not in chart/README.md's values table: {sorted(values - documented)}"
    assert not documented - values, f"documented but not in values.yaml: {sorted(documented - values)}"


def test_schema_describes_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def check(node: dict[str, Any], props: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            assert key in props, f"{prefix}{key} is in values.yaml but not in values.schema.json"
            sub = props[key]
            if isinstance(value, dict) and sub.get("additionalProperties") is False:
                # Maps keyed by the user's names (pools, prometheusRule.alerts) are empty here.
                check(value, sub.get("properties", {}), f"{prefix}{key}.")

    check(values, schema["properties"], "")


def _daemon() -> list[str]:
    exe = shutil.which("ate-devplugin")
    if exe:
        return [exe]
    probe = subprocess.run([sys.executable, "-c", "import ate_devplugin"], capture_output=True, check=False)
    if probe.returncode == 0:
        return [sys.executable, "-m", "ate_devplugin"]
    pytest.skip("the daemon is not installed (pip install -e .)")


def test_rendered_config_accepted_by_daemon(any_helm: Helm, ci_values: Path, tmp_path: Path) -> None:
    docs = any_helm.template([ci_values])
    config_maps = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    if not config_maps:  # the values point at a ConfigMap managed outside the chart
        assert (yaml.safe_load(ci_values.read_text()) or {})["deviceConfig"]["existingConfigMap"]
        return
    for cm in config_maps:  # one per pool
        path = tmp_path / f"{cm['metadata']['name']}.yaml"
        path.write_text(cm["data"]["config.yaml"])
        out = subprocess.run(
            [*_daemon(), "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
        assert out.returncode == 0, (
            f"check-config refused the chart's config:\n{out.stdout}{out.stderr}\n{path.read_text()}"
        )


def test_daemon_knows_every_flag(any_helm: Helm, ci_values: Path) -> None:
    out = subprocess.run([*_daemon(), "run", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    known = set(re.findall(r"--[a-z][a-z-]+", out.stdout))
    values = yaml.safe_load(ci_values.read_text()) or {}
    extra = set(values.get("daemon", {}).get("extraArgs", []))
    for ds in daemonsets(any_helm.template([ci_values])):
        container = ds["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][0] == "run"
        for arg in container["args"][1:]:
            if arg in extra:
                continue
            flag = arg.split("=", 1)[0]
            assert flag in known, f"the chart passes {flag}, which `ate-devplugin run` does not know"


def test_the_microvm_preset_is_accepted_by_the_daemon(any_helm: Helm, tmp_path: Path) -> None:
    preset = CHART.parent / "docs" / "examples" / "microvm-worker-values.yaml"
    (cm,) = [d for d in by_kind(any_helm.template([preset]), "ConfigMap") if "config.yaml" in d.get("data", {})]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    out = subprocess.run(
        [*_daemon(), "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"{out.stdout}{out.stderr}"
