"""The command line as an operator meets it: exit codes and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ate_devplugin import __version__


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ate_devplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_version() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"ate-devplugin {__version__}"


def test_check_config_ok(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n")
    result = run("check-config", str(config))
    assert result.returncode == 0, result.stderr
    assert "ate.dev/kvm" in result.stdout


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_bad_config_exits_2_with_one_line(tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: -1}]\n")
    plugin_dir = tmp_path / "plugins"
    args = [str(config)] if command == "check-config" else ["--config", str(config), "--plugin-dir", str(plugin_dir)]
    result = run(command, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("ate-devplugin: config error: resources[0].units:")
    assert not plugin_dir.exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "env", "field"),
    [
        (["--device-root", "dev"], {}, "device_root"),
        (["--metrics-address", "localhost"], {}, "metrics_address"),
        ([], {"ATE_DEVPLUGIN_LOG_FORMAT": "xml"}, "log_format"),
        (["--plugin-dir", "/" + "p" * 100], {}, "resources[0].name"),
        (["--cdi-dir", "run/cdi"], {}, "cdi_dir"),
        ([], {"ATE_DEVPLUGIN_CDI_DIR": "cdi"}, "cdi_dir"),
        (["--pod-resources", "yes"], {}, "pod_resources"),
        (["--pod-resources-socket", "kubelet.sock"], {}, "pod_resources_socket"),
        ([], {"ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "-1"}, "pod_resources_interval"),
        (["--pod-resources-interval", "nan"], {}, "pod_resources_interval"),
        (["--pod-resources-interval", "soon"], {}, "pod_resources_interval"),
    ],
)
def test_bad_settings_exit_2(args: list[str], env: dict[str, str], field: str) -> None:
    result = run("run", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"ate-devplugin: config error: {field}:"), result.stderr


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ("allocate: cdi-only", "resources[0].allocate"),
        ("cdi: {file_mode: 438}", "resources[0].cdi.file_mode"),
        ("cdi: {file_mode: '0999'}", "resources[0].cdi.file_mode"),
        ("cdi: {uid: -1}", "resources[0].cdi.uid"),
        ("cdi: {gid: 4294967296}", "resources[0].cdi.gid"),
        ("cdi: {mode: '0666'}", "resources[0].cdi.mode"),
    ],
)
def test_bad_cdi_settings_exit_2_naming_the_field(tmp_path: Path, resource: str, field: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], {resource}}}]\n")
    result = run("run", "--config", str(config), "--plugin-dir", str(tmp_path / "plugins"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"ate-devplugin: config error: {field}:"), result.stderr
