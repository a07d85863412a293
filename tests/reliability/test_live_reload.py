"""Live configuration reload against the kubelet's real device manager (issue 6).

The config file is changed three ways: rewritten in place, replaced by a rename (what
most editors and config tools do), and through the symlink swap of a mounted ConfigMap.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import add_device_node
from tests.harness.faults import ConfigMapDir, SpawnDaemon, log_matches
from tests.harness.kubelet import DeviceSpec, KubeletBench, Namespace
from tests.harness.wait import wait_until

KVM, TUN, VHOST = "ate.dev/kvm", "ate.dev/tun", "ate.dev/vhost"
KVM_SOCKET, TUN_SOCKET, VHOST_SOCKET = "ate-ate-dev-kvm.sock", "ate-ate-dev-tun.sock", "ate-ate-dev-vhost.sock"

BEFORE = """\
resources:
  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 64}
  - {name: ate.dev/tun, devices: [/dev/net/tun], units: 8}
"""
# kvm unchanged (the same entry, written differently), tun gone, vhost new.
AFTER = """\
# reloaded
resources:
  - name: ate.dev/kvm
    devices: /dev/kvm
    units: 64
    permissions: rw
  - {name: ate.dev/vhost, devices: [/dev/vhost-net], units: 4}
"""
INVALID = """\
resources:
  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 64}
  - {name: ate.dev/vhost, devices: [/dev/vhost-net], units: many}
"""

EDITS = ("in-place", "rename", "configmap")


class ConfigFile:
    """The daemon's config file, changed the way ``style`` says."""

    def __init__(self, directory: Path, style: str, text: str) -> None:
        self.style = style
        directory.mkdir(parents=True, exist_ok=True)
        self._configmap = ConfigMapDir(directory / "configmap") if style == "configmap" else None
        self.path = self._configmap.path("config.yaml") if self._configmap else directory / "config.yaml"
        self.write(text)

    def write(self, text: str) -> None:
        if self._configmap is not None:
            self._configmap.write({"config.yaml": text})
        elif self.style == "rename":
            tmp = self.path.with_name(".config.yaml.tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)
        else:
            self.path.write_text(text)


@pytest.fixture
def devices(device_root: Path) -> Path:
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    add_device_node(device_root, "vhost-net", "/dev/vhost-net")
    return device_root


def start(
    spawn_daemon: SpawnDaemon, ns: Namespace, root: Path, tmp_path: Path, style: str, text: str = BEFORE
) -> tuple[DevicePluginDaemon, ConfigFile]:
    config = ConfigFile(tmp_path / "etc", style, text)
    return spawn_daemon(root, ns=ns, args=["--config", str(config.path)]), config


def reloads(d: DevicePluginDaemon, result: str) -> float:
    return d.metric("ate_devplugin_config_reloads_total", result=result)


def kubelet_lines(kubelet: KubeletBench, words: str, resource: str) -> list[str]:
    pattern = re.compile(rf'resource(Name)?="{re.escape(resource)}"')
    return [line for line in kubelet.log_text().splitlines() if words in line and pattern.search(line)]


def watch_kubelet_until(
    kubelet: KubeletBench, done: Callable[[dict[str, tuple[int, int]]], bool], timeout: float = 30
) -> list[dict[str, tuple[int, int]]]:
    """Samples the kubelet's capacity until ``done`` holds; returns every sample."""
    samples: list[dict[str, tuple[int, int]]] = []

    def sample() -> bool:
        c = kubelet.capacity()
        samples.append({r: c.of(r) for r in (KVM, TUN, VHOST)})
        return done(samples[-1])

    wait_until(sample, timeout, "the kubelet to see the new config", interval=0.005)
    return samples


@pytest.fixture(params=EDITS)
def serving(
    request: pytest.FixtureRequest,
    kubelet: KubeletBench,
    kubelet_ns: Namespace,
    spawn_daemon: SpawnDaemon,
    devices: Path,
    tmp_path: Path,
) -> tuple[DevicePluginDaemon, ConfigFile]:
    """The daemon serving BEFORE, its config file to be edited each way in EDITS."""
    d, config = start(spawn_daemon, kubelet_ns, devices, tmp_path, request.param)
    kubelet.wait(KVM, capacity=64, allocatable=64, timeout=30)
    kubelet.wait(TUN, capacity=8, allocatable=8, timeout=30)
    return d, config


def test_reload_adds_removes_and_leaves_the_rest_untouched(
    kubelet: KubeletBench, kubelet_ns: Namespace, serving: tuple[DevicePluginDaemon, ConfigFile]
) -> None:
    d, config = serving
    held = kubelet.allocate("pod-a", "vm", {KVM: 1}).device_ids
    kvm_socket = kubelet_ns.path(f"/var/lib/kubelet/device-plugins/{KVM_SOCKET}").stat().st_ino
    config.write(AFTER)
    samples = watch_kubelet_until(kubelet, lambda s: s[VHOST] == (4, 4) and s[TUN][1] == 0)
    # The unchanged resource never left the kubelet's view, not for one sample.
    assert {s[KVM] for s in samples} == {(64, 64)}
    # Removed: stopped, its socket gone, its series gone; the kubelet keeps the
    # capacity for its grace period with nothing allocatable.
    assert TUN_SOCKET not in kubelet_ns.sockets()
    assert kubelet.capacity().of(TUN) == (8, 0)
    assert math.isnan(d.metric("ate_devplugin_registered", resource_name=TUN))  # the series is gone
    # Added: registered and allocatable with its own device.
    assert kubelet.allocate("pod-b", "vm", {VHOST: 1}).devices == [DeviceSpec("/dev/vhost-net", "/dev/vhost-net", "rw")]
    # Untouched: same socket, same stream, one registration, no update re-sent.
    assert kubelet_ns.path(f"/var/lib/kubelet/device-plugins/{KVM_SOCKET}").stat().st_ino == kvm_socket
    assert d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM) == 1
    assert d.metric("ate_devplugin_list_and_watch_updates_total", resource_name=KVM) == 1
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    assert kubelet_lines(kubelet, "Mark all resources Unhealthy", KVM) == []
    assert kubelet_lines(kubelet, "Device plugin disconnected", KVM) == []
    assert len(kubelet_lines(kubelet, "Mark all resources Unhealthy", TUN)) == 1
    assert kubelet.devices("pod-a", "vm") == held
    assert reloads(d, "success") == 1
    assert reloads(d, "failure") == 0
    wait_until(d.ready, 10, "readyz")
    # Writing the same config again changes nothing at all.
    config.write(AFTER)
    config.write(AFTER)
    kubelet.wait(VHOST, capacity=4, allocatable=4, timeout=10)
    assert reloads(d, "success") == 1
    assert d.metric("ate_devplugin_registrations_total", resource_name=VHOST, result="success") == 1


def test_invalid_new_config_is_rejected_once_and_the_running_one_stays(
    kubelet: KubeletBench, serving: tuple[DevicePluginDaemon, ConfigFile]
) -> None:
    d, config = serving
    config.write(INVALID)
    wait_until(lambda: reloads(d, "failure") >= 1, 10, "the reload to be rejected")
    assert reloads(d, "success") == 0
    # The running config stays, streams and all.
    assert kubelet.capacity().of(KVM) == (64, 64)
    assert kubelet.capacity().of(TUN) == (8, 8)
    assert kubelet.capacity().of(VHOST) == (0, 0)
    assert d.metric("ate_devplugin_list_and_watch_streams", resource_name=TUN) == 1
    assert d.ready()
    # A good file after the bad one is applied. That is also the positive signal that the
    # daemon has handled every event of the bad file: it was reported once, no more.
    config.write(AFTER)
    kubelet.wait(VHOST, capacity=4, allocatable=4, timeout=30)
    kubelet.wait(TUN, capacity=8, allocatable=0, timeout=30)
    assert reloads(d, "success") == 1
    assert reloads(d, "failure") == 1
    rejected = log_matches(d.log_lines(), "config reload rejected")
    assert len(rejected) == 1, [line["msg"] for line in rejected]
    assert rejected[0]["level"] == "error"
    assert "resources[1].units" in str(rejected[0]["msg"])


def test_changed_resource_is_served_again_with_its_new_settings(
    kubelet: KubeletBench, kubelet_ns: Namespace, spawn_daemon: SpawnDaemon, devices: Path, tmp_path: Path
) -> None:
    d, config = start(spawn_daemon, kubelet_ns, devices, tmp_path, "rename")
    kubelet.wait(KVM, capacity=64, allocatable=64, timeout=30)
    kubelet.wait(TUN, capacity=8, allocatable=8, timeout=30)
    config.write(BEFORE.replace("units: 64", "units: 32"))
    kubelet.wait(KVM, capacity=32, allocatable=32, timeout=30)
    assert kubelet.capacity().of(TUN) == (8, 8)
    assert d.metric("ate_devplugin_registrations_total", resource_name=TUN, result="success") == 1
    assert d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM) == 1
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [DeviceSpec("/dev/kvm", "/dev/kvm", "rw")]


def test_config_file_deleted_then_restored(
    kubelet: KubeletBench, kubelet_ns: Namespace, spawn_daemon: SpawnDaemon, devices: Path, tmp_path: Path
) -> None:
    d, config = start(spawn_daemon, kubelet_ns, devices, tmp_path, "in-place")
    kubelet.wait(TUN, capacity=8, allocatable=8, timeout=30)
    config.path.unlink()
    wait_until(lambda: reloads(d, "failure") == 1, 10, "the missing file to be rejected")
    assert kubelet.capacity().of(TUN) == (8, 8)
    config.write(AFTER)
    kubelet.wait(VHOST, capacity=4, allocatable=4, timeout=30)
    assert reloads(d, "success") == 1


def test_relative_config_path_is_reloaded_too(
    kubelet: KubeletBench,
    kubelet_ns: Namespace,
    spawn_daemon: SpawnDaemon,
    devices: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--config config.yaml`` from the working directory: the same live reload."""
    config = ConfigFile(tmp_path / "etc", "rename", BEFORE)
    monkeypatch.chdir(config.path.parent)  # the daemon starts in this directory
    d = spawn_daemon(devices, ns=kubelet_ns, args=["--config", "config.yaml"])
    kubelet.wait(TUN, capacity=8, allocatable=8, timeout=30)
    config.write(AFTER)
    kubelet.wait(VHOST, capacity=4, allocatable=4, timeout=10)
    assert reloads(d, "success") == 1
