"""ate-devplugin against the kubelet's real device manager (issue 2 scenarios).

Each test runs in a private mount namespace with the bench (the kubelet's device manager
of a pinned release) and our daemon, over a device root of real character device nodes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.harness.daemon import MakeDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.kubelet import BenchError, DeviceSpec, KubeletBench, Namespace
from tests.harness.microvm import run_vm
from tests.harness.require import require
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
UNITS = 4096
KVM_SPEC = DeviceSpec(container_path="/dev/kvm", host_path="/dev/kvm", permissions="rw")


def full(kubelet: KubeletBench, resource: str = KVM, units: int = UNITS, timeout: float = 30) -> None:
    kubelet.wait(resource, capacity=units, allocatable=units, timeout=timeout)


def test_registration_advertises_every_unit(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon()
    full(kubelet)
    assert kubelet.capacity().of(KVM) == (UNITS, UNITS)
    wait_until(d.ready, 10, "readyz")
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1
    assert d.metric("ate_devplugin_registered", resource_name=KVM) == 1


def test_allocation_gives_exactly_the_device_node(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    daemon()
    full(kubelet)
    alloc = kubelet.allocate("pod-a", "vm", {KVM: 1})
    assert alloc.devices == [KVM_SPEC]
    assert (alloc.mounts, alloc.envs, alloc.cdi_devices) == ([], {}, [])
    assert len(alloc.device_ids[KVM]) == 1
    # Shareable: one unit fewer to hand out, nothing else changes.
    assert kubelet.capacity().of(KVM) == (UNITS, UNITS)
    kubelet.allocate("pod-b", "vm", {KVM: 1})
    assert kubelet.devices("pod-a", "vm") != kubelet.devices("pod-b", "vm")


def test_the_allocated_device_runs_a_vm(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    """What a VM worker does with what the kubelet hands its container, at this level: the
    node behind the allocated device (the device root's copy of /dev/kvm, as the runtime
    would create it in the container) runs a micro-VM to its HLT (tests/harness/microvm.py)."""
    require(Path("/dev/kvm").is_char_device(), "no /dev/kvm on this machine")
    daemon()
    full(kubelet)
    (spec,) = kubelet.allocate("pod-vm", "vm", {KVM: 1}).devices
    node = device_root / Path(spec.host_path).relative_to("/dev")
    report = run_vm(str(node))
    assert (report["api_version"], report["serial"], report["exits"][-1]) == (12, "4\n", ["hlt"]), report


def test_by_default_the_kubelet_makes_one_call_per_admission(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon()
    full(kubelet)
    assert len(kubelet.allocate("pod-a", "vm", {KVM: 2}).device_ids[KVM]) == 2
    kubelet.allocate("pod-b", "vm", {KVM: 1})
    assert d.metric("ate_devplugin_allocate_requests_total", resource_name=KVM, code="OK") == 2
    # GetPreferredAllocation not advertised: the kubelet picks the units itself.
    assert d.metric("ate_devplugin_preferred_allocation_requests_total", resource_name=KVM) == 0


def test_kubelet_uses_our_preferred_allocation(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon(f"resources:\n  - name: {KVM}\n    devices: [/dev/kvm]\n    preferred_allocation: true\n")
    full(kubelet)
    # Without a preference the kubelet picks from an unordered set; ours is lowest-first.
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).device_ids == {KVM: ["kvm-0"]}
    assert kubelet.allocate("pod-b", "vm", {KVM: 2}).device_ids == {KVM: ["kvm-1", "kvm-2"]}
    assert d.metric("ate_devplugin_preferred_allocation_requests_total", resource_name=KVM) == 2


def test_kubelet_restart_reregisters_and_keeps_allocations(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon()
    full(kubelet)
    before = kubelet.allocate("pod-a", "vm", {KVM: 1}).device_ids
    kubelet.restart()  # kill the process, start a new one: sockets wiped, checkpoint kept
    full(kubelet)
    assert kubelet.devices("pod-a", "vm") == before
    assert kubelet.allocate("pod-b", "vm", {KVM: 1}).devices == [KVM_SPEC]
    assert d.metric("ate_devplugin_kubelet_restarts_total") == 1
    # Exactly one registration per kubelet, however the restart's events interleave.
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 2
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    wait_until(d.ready, 10, "readyz after kubelet restart")


def test_kubelet_restart_in_process(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    daemon()
    full(kubelet)
    kubelet.restart(in_process=True)
    full(kubelet)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_plugin_restart_is_clean(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, sig: signal.Signals
) -> None:
    d = daemon()
    full(kubelet)
    kubelet.allocate("pod-a", "vm", {KVM: 1})
    started = time.monotonic()
    assert d.stop(sig) == 0
    assert time.monotonic() - started < 5
    assert "ate-ate-dev-kvm.sock" not in kubelet_ns.sockets()
    kubelet.wait(KVM, capacity=UNITS, allocatable=0)  # stream ended: all unhealthy, capacity kept
    d.start()
    full(kubelet)
    assert kubelet.allocate("pod-b", "vm", {KVM: 1}).devices == [KVM_SPEC]


def test_plugin_sigkill_leaves_stale_socket_that_restart_handles(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    d = daemon()
    full(kubelet)
    d.stop(signal.SIGKILL)
    assert "ate-ate-dev-kvm.sock" in kubelet_ns.sockets()  # stale
    kubelet.wait(KVM, capacity=UNITS, allocatable=0)
    d.start()
    full(kubelet)
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]


def test_device_removed_then_restored(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    d = daemon()
    full(kubelet)
    remove_device_node(device_root, "kvm")
    kubelet.wait(KVM, capacity=UNITS, allocatable=0)
    assert d.metric("ate_devplugin_devices", resource_name=KVM, health="unhealthy") == UNITS
    with pytest.raises(BenchError, match="no healthy devices present"):
        kubelet.allocate("pod-a", "vm", {KVM: 1})
    add_device_node(device_root, "kvm", "/dev/kvm")
    full(kubelet)
    assert kubelet.allocate("pod-b", "vm", {KVM: 1}).devices == [KVM_SPEC]
    assert d.metric("ate_devplugin_device_health_changes_total", resource_name=KVM, health="unhealthy") == 1


def test_device_absent_at_start_then_created(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    remove_device_node(device_root, "kvm")
    d = daemon()
    assert kubelet.capacity().of(KVM) == (0, 0)
    assert d.ready()  # nothing present, nothing to register
    add_device_node(device_root, "kvm", "/dev/kvm")
    full(kubelet)
    wait_until(d.ready, 10, "readyz")
    # Registered once, and the stream's first list is the only one: the full, healthy set.
    # Had anything been advertised while the node was absent, the kubelet would have held
    # a second registration or the stream a second list.
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    assert d.metric("ate_devplugin_list_and_watch_updates_total", resource_name=KVM) == 1
    assert d.metric("ate_devplugin_device_health_changes_total", resource_name=KVM, health="unhealthy") == 0


def test_kubelet_absent_at_start_then_started(
    kubelet_ns: Namespace, kubelet_version: str, daemon: MakeDaemon, tmp_path: Path
) -> None:
    d = daemon()
    assert not d.ready()
    with KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet:
        kubelet.start()
        full(kubelet)
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1


def test_two_resources_with_mounts_and_env(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    add_device_node(device_root, "vhost-net", "/dev/vhost-net")
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    daemon(
        """
resources:
  - name: ate.dev/kvm
    devices: [/dev/kvm]
    units: 64
  - name: ate.dev/vhost
    devices: [/dev/vhost-net, /dev/net/tun]
    units: 8
    permissions: rwm
    mounts: [{container_path: /etc/ate, host_path: /var/ate, read_only: true}]
    env: {ATE_VHOST: "1"}
"""
    )
    full(kubelet, KVM, 64)
    full(kubelet, "ate.dev/vhost", 8)
    alloc = kubelet.allocate("pod-a", "vm", {KVM: 1, "ate.dev/vhost": 1})
    assert sorted(alloc.devices, key=lambda s: s.host_path) == [
        KVM_SPEC,
        DeviceSpec("/dev/net/tun", "/dev/net/tun", "rwm"),
        DeviceSpec("/dev/vhost-net", "/dev/vhost-net", "rwm"),
    ]
    assert alloc.envs == {"ATE_VHOST": "1"}
    assert [(m.container_path, m.host_path, m.read_only) for m in alloc.mounts] == [("/etc/ate", "/var/ate", True)]
    # One of two nodes gone: the whole resource is unhealthy, the other resource is not.
    remove_device_node(device_root, "net/tun")
    kubelet.wait("ate.dev/vhost", capacity=8, allocatable=0)
    assert kubelet.capacity().of(KVM) == (64, 64)


def test_the_kubelet_takes_the_cdi_answer(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    """Allocate's ``cdi_devices`` reaches the kubelet's container options as the CDI name
    (what it hands the runtime), alone or beside the device specs; the spec file is in place
    while the daemon runs and gone after it stops."""
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    d = daemon(
        """
resources:
  - {name: ate.dev/kvm, devices: [/dev/kvm], allocate: cdi, cdi: {file_mode: "0666"}}
  - {name: ate.dev/tun, devices: [/dev/net/tun], allocate: both, env: {ATE_TUN: "1"}}
"""
    )
    full(kubelet)
    full(kubelet, "ate.dev/tun")
    kvm = kubelet.allocate("pod-a", "vm", {KVM: 1})
    assert (kvm.cdi_devices, kvm.devices, kvm.mounts, kvm.envs) == (["ate.dev/kvm=kvm"], [], [], {})
    tun = kubelet.allocate("pod-b", "vm", {"ate.dev/tun": 1})
    assert tun.cdi_devices == ["ate.dev/tun=tun"]
    assert tun.devices == [DeviceSpec("/dev/net/tun", "/dev/net/tun", "rw")]
    assert tun.envs == {"ATE_TUN": "1"}
    specs = d.cdi_dir
    assert sorted(p.name for p in specs.iterdir()) == ["ate.dev-kvm.json", "ate.dev-tun.json"]
    assert '"fileMode": 438' in (specs / "ate.dev-kvm.json").read_text()
    assert d.stop(signal.SIGTERM) == 0
    assert list(specs.iterdir()) == []


def lowest_allocatable(kubelet: KubeletBench, seconds: float) -> int:
    """The lowest allocatable of ``ate.dev/kvm`` the device manager reports over ``seconds``."""
    lowest = UNITS
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lowest = min(lowest, kubelet.capacity().of(KVM)[1])
        time.sleep(0.01)
    return lowest


def test_two_pods_overlapping_on_their_own_sockets(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, kubelet_version: str
) -> None:
    """A rolling update with maxSurge 1: the new plugin pod (its own socket, named with its
    pod UID) registers while the old one still serves, then the old one stops. 1.37's
    device manager keeps one endpoint per socket: allocatable never drops. Earlier ones keep
    one per resource: the old pod's stop marks the resource unhealthy although the new pod
    serves it (so the chart overlaps pods only on 1.37)."""
    old = daemon(env={"ATE_DEVPLUGIN_SOCKET_SUFFIX": "4c2f-old"})
    full(kubelet)
    new = daemon(env={"ATE_DEVPLUGIN_SOCKET_SUFFIX": "9a1e-new"})
    wait_until(lambda: new.metric("ate_devplugin_registered", resource_name=KVM) == 1, 30, "the new pod registered")
    assert {"ate-ate-dev-kvm-4c2f-old.sock", "ate-ate-dev-kvm-9a1e-new.sock"} <= set(kubelet_ns.sockets())
    overlapping = lowest_allocatable(kubelet, 1.0)
    assert old.stop() == 0
    after = lowest_allocatable(kubelet, 2.0)
    print(
        f"kubelet {kubelet_version}: lowest allocatable {overlapping} while both serve, {after} after the old stopped"
    )
    assert overlapping == UNITS
    if tuple(map(int, kubelet_version.split("."))) < (1, 37):
        assert after == 0
        return
    assert after == UNITS
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]
    assert new.metric("ate_devplugin_allocate_requests_total", resource_name=KVM, code="OK") == 1
