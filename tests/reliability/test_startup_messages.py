"""What a real daemon tells an operator at start, in its log: where it waits for the
kubelet (a wrong --plugin-dir shows at once, devices present or not), and the settings
that do nothing in its mode."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.devices import add_device_node, make_device_root
from tests.harness.faults import SpawnDaemon, log_matches
from tests.harness.wait import wait_until


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A plugin directory without a kubelet.sock (short: a socket path must fit 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="ate-", dir="/tmp") as d:
        yield Path(d)


def test_no_kubelet_socket_is_logged_with_its_path_at_info_once_then_at_debug(
    spawn_daemon: SpawnDaemon, plugin_dir: Path, tmp_path: Path
) -> None:
    root = make_device_root(tmp_path / "dev", {})  # no device yet
    d = spawn_daemon(root, plugin_dir=str(plugin_dir))  # --log-level debug
    socket = str(plugin_dir / "kubelet.sock")
    words = f"waiting for the kubelet socket at {socket}"

    def said(level: str) -> list[dict[str, object]]:
        return log_matches(d.log_lines(), words, level=level)

    wait_until(lambda: said("info"), 30, "the info line naming the kubelet socket")
    (line,) = said("info")
    assert line["socket"] == socket
    # A later check (the device appears: discovered again) says it at debug only.
    add_device_node(root, "kvm", "/dev/kvm")
    wait_until(lambda: (plugin_dir / "ate-ate-dev-kvm.sock").exists(), 30, "the plugin socket")
    wait_until(lambda: said("debug"), 30, "the debug line of a later check")
    assert len(said("info")) == 1
    assert all(line["socket"] == socket for line in said("debug"))
    assert d.running()


def test_settings_that_do_nothing_are_warned_about_at_start(
    spawn_daemon: SpawnDaemon, plugin_dir: Path, tmp_path: Path
) -> None:
    root = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    d = spawn_daemon(
        root,
        plugin_dir=str(plugin_dir),
        config="resources: [{name: ate.dev/kvm, devices: [/dev/kvm], cdi: {file_mode: '0666'}}]\n",
        args=["--dra-slots", "8", "--pod-resources", "off", "--pod-resources-interval", "5"],
        env={"ATE_DEVPLUGIN_REGISTRY_DIR": "/var/lib/kubelet/plugins_registry"},
    )
    warnings = [(line["setting"], line["msg"]) for line in d.log_lines() if line.get("level") == "warning"]
    assert warnings == [
        (
            "ATE_DEVPLUGIN_REGISTRY_DIR",
            "ATE_DEVPLUGIN_REGISTRY_DIR: does nothing in mode device-plugin: only the DRA driver"
            " (--mode dra or both) uses it",
        ),
        (
            "--dra-slots",
            "--dra-slots: does nothing in mode device-plugin: only the DRA driver (--mode dra or both) uses it",
        ),
        ("--pod-resources-interval", "--pod-resources-interval: does nothing while --pod-resources is off"),
        (
            "resources[0].cdi",
            "resources[0].cdi: does nothing with allocate: devices in mode device-plugin: no CDI spec is written"
            " (hint: set allocate: cdi or both to answer with the CDI device)",
        ),
    ]
    assert d.running()  # a warning, not an error
