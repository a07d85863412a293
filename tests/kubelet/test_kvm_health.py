"""KVM health from the functional probe (local mode), against the kubelet's real device manager.

The daemon runs in the bench's private mount namespace and opens the nodes of its device
root itself: a real ``10:232`` node opens this machine's KVM, a ``1:3`` node named ``kvm``
is what ``/dev/null`` is. Each time from a broken device to the kubelet's allocatable 0
is printed (``-s``): it is a figure for the docs, not a bound.
"""

from __future__ import annotations

import re
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from ate_devplugin.cpu.features import FEATURES
from ate_devplugin.kvm.facts import cpu_profile, read_node_facts
from ate_devplugin.kvm.probe import check
from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import DeviceNumber, add_device_node
from tests.harness.kubelet import BenchError, KubeletBench, Namespace
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
PROBER = "ate.dev/kvm-prober"
UNITS = 4096
NULL = DeviceNumber(1, 3)
REAL_KVM = DeviceNumber(10, 232)
FAST = {"ATE_DEVPLUGIN_KVM_PROBE_PERIOD": "1"}

pytestmark = pytest.mark.skipif(not Path("/dev/kvm").exists(), reason="needs /dev/kvm")


def readyz(d: DevicePluginDaemon) -> str:
    return d.get("/readyz")[1].decode()


def swap(device_root: Path, number: DeviceNumber) -> int:
    """Replaces the kvm node at once (a rename over it, as udev does); when, in monotonic ns."""
    add_device_node(device_root, ".kvm.new", number)
    started = time.monotonic_ns()
    (device_root / ".kvm.new").rename(device_root / "kvm")
    return started


def test_a_null_node_named_kvm_is_never_healthy(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    add_device_node(device_root, "kvm", NULL)
    d = daemon()
    kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=10)
    wait_until(d.ready, 10, "readyz")
    assert "KVM probe failed: not-a-kvm-device: /dev/kvm: character device 1:3 is not KVM's 10:232" in readyz(d)
    with pytest.raises(BenchError, match="no healthy devices present"):
        kubelet.allocate("pod-a", "vm", {KVM: 1})
    assert d.metric("ate_devplugin_kvm_probes_total", resource_name=KVM, reason="not-a-kvm-device") == 1
    assert d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="failed") == 1
    assert d.metric("ate_devplugin_devices", resource_name=KVM, health="unhealthy") == UNITS
    # Never advertised healthy: the first list the kubelet got was the failing one.
    assert d.metric("ate_devplugin_device_health_changes_total", resource_name=KVM, health="healthy") == 0
    assert d.metric("ate_devplugin_list_and_watch_updates_total", resource_name=KVM) == 1


def test_a_swap_to_null_and_back_is_followed(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    d = daemon(env=FAST)
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    wait_until(lambda: d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="passed") == 1, 10, "pass")
    assert "KVM probe" not in readyz(d)
    kubelet.allocate("pod-a", "vm", {KVM: 1})

    waiting = kubelet.begin_wait(KVM, capacity=UNITS, allocatable=0, timeout=5)
    broke = swap(device_root, NULL)
    print(f"1:3 swapped in -> allocatable 0 in {(waiting.result().done_monotonic_ns - broke) / 1e6:.1f} ms")
    assert "not-a-kvm-device" in readyz(d)
    with pytest.raises(BenchError, match="no healthy devices present"):
        kubelet.allocate("pod-b", "vm", {KVM: 1})

    waiting = kubelet.begin_wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=5)
    fixed = swap(device_root, REAL_KVM)
    print(f"10:232 swapped back -> allocatable {UNITS} in {(waiting.result().done_monotonic_ns - fixed) / 1e6:.1f} ms")
    kubelet.allocate("pod-c", "vm", {KVM: 1})
    assert "KVM probe" not in readyz(d)
    assert d.metric("ate_devplugin_device_health_changes_total", resource_name=KVM, health="unhealthy") == 1
    assert d.metric("ate_devplugin_device_health_changes_total", resource_name=KVM, health="healthy") == 2
    failures = [line for line in d.log_lines() if line.get("msg", "").startswith("KVM probe failed")]
    assert len(failures) == 1  # once while it lasted, however many periodic probes


def test_a_kvm_node_the_probe_cannot_open_is_said_and_judged_by_existence_until_it_can(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    """The real 10:232 node put on a nodev mount at run time: existence and the device
    number still say KVM, only opening it (the probe, in its child process) says no. A probe
    that may not open the device cannot judge it: the units stay Healthy (existence), the
    state is cannot-probe and /readyz says why. No filesystem event tells of a remount: the
    periodic probe (1 s here) finds it, both ways."""
    root = str(device_root)

    def mount(*options: str) -> None:
        kubelet_ns.run(["mount", *options, root, root], check=True, capture_output=True)

    d = daemon(env=FAST)
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    wait_until(lambda: d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="passed") == 1, 10, "pass")
    mount("--bind")
    mount("-o", "remount,bind,nodev")
    wait_until(lambda: d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="cannot-probe") == 1, 10,
               "cannot-probe")  # fmt: skip
    assert "KVM probe could not judge the device: no-permission: /dev/kvm: opening character device 10:232: EACCES" in (
        readyz(d)
    )
    assert d.metric("ate_devplugin_kvm_probe_reason", resource_name=KVM, reason="no-permission") == 1
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=5)  # existence: still every unit
    assert d.metric("ate_devplugin_devices", resource_name=KVM, health="unhealthy") == 0

    mount("-o", "remount,bind,dev")
    wait_until(lambda: d.metric("ate_devplugin_kvm_probe_state", resource_name=KVM, state="passed") == 1, 10, "pass")
    assert "KVM probe" not in readyz(d)


def test_the_probers_resource_is_there_on_every_node_and_while_the_device_fails(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path
) -> None:
    """Socket mode: ate.dev/kvm-prober is advertised, Healthy, with no KVM on the node (the
    chart's prober pod is admitted and given nothing) and while ate.dev/kvm fails (a 1:3
    node): the prober is admitted, and given the node that is there."""
    (device_root / "kvm").unlink()  # a node without KVM
    d = daemon(
        env={
            "ATE_DEVPLUGIN_KVM_PROBE": "socket",
            "ATE_DEVPLUGIN_KVM_PROBE_SOCKET": str(device_root.parent / "prober" / "prober.sock"),
        }
    )
    kubelet.wait(PROBER, capacity=4, allocatable=4, timeout=30)
    kubelet.wait(KVM, present=False, timeout=5)
    nothing = kubelet.allocate("prober-a", "probe", {PROBER: 1})
    assert (list(nothing.device_ids), nothing.devices) == ([PROBER], [])
    add_device_node(device_root, "kvm", NULL)
    kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=10)  # not KVM's: Unhealthy, unopened
    given = kubelet.allocate("prober-b", "probe", {PROBER: 1})
    assert [(dev.container_path, dev.host_path) for dev in given.devices] == [("/dev/kvm", "/dev/kvm")]
    assert d.metric("ate_devplugin_devices", resource_name=PROBER, health="healthy") == 4


def test_a_resource_that_is_not_kvm_keeps_the_existence_check(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path
) -> None:
    add_device_node(device_root, "kvm", NULL)
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    add_device_node(device_root, "null", NULL)
    d = daemon(
        f"""
resources:
  - name: {KVM}
    devices: [/dev/kvm]
    units: 64
  - name: ate.dev/tun
    devices: [/dev/net/tun]
    units: 8
  - name: ate.dev/null
    devices: [/dev/null]
    units: 4
    health: exists
"""
    )
    kubelet.wait(KVM, capacity=64, allocatable=0, timeout=10)
    kubelet.wait("ate.dev/tun", capacity=8, allocatable=8, timeout=10)
    kubelet.wait("ate.dev/null", capacity=4, allocatable=4, timeout=10)
    assert kubelet.allocate("pod-a", "vm", {"ate.dev/tun": 1, "ate.dev/null": 1}).device_ids.keys() == {
        "ate.dev/tun",
        "ate.dev/null",
    }
    # Only the KVM resource has probe series.
    names = {labels for (name, labels) in d.metrics() if name == "ate_devplugin_kvm_probe_state"}
    assert {dict(labels)["resource_name"] for labels in names} == {KVM}


def test_the_facts_become_an_nfd_feature_file(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path, tmp_path: Path
) -> None:
    """Device-plugin mode's node labels: nfd-worker's local source reads this file."""
    features = tmp_path / "features.d"
    features.mkdir()
    d = daemon(env={"ATE_DEVPLUGIN_NFD_FEATURES_DIR": str(features)})
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    path = features / "ate-devplugin-kvm"
    wait_until(lambda: path.exists() and "ate.dev/cpuidDigest=" in path.read_text(), 10, "the feature file")
    labels = dict(line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#"))
    assert labels["ate.dev/kvmImplementation"] == read_node_facts().kvm_implementation
    assert labels["ate.dev/kvmApiVersion"] == "12"
    assert re.fullmatch(r"[0-9a-f]{32}", labels["ate.dev/cpuidDigest"])
    assert any(name.startswith("ate.dev/cpuid.") for name in labels)
    assert not list(features.glob(".*"))  # no temporary file left for nfd-worker to skip
    print("feature file:", len(labels), "labels;", path.read_text().splitlines()[0])
    d.stop()


def test_restore_profiles_are_answered_on_the_node_and_follow_a_reload(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path, tmp_path: Path
) -> None:
    """The daemon probing this machine's KVM answers each restore profile as a node label
    (NFD feature file) and a metric, and says why not once in its log; a reload that changes
    a profile alone flips its answer, with no restart and no re-registration."""
    result = check("/dev/kvm", 5)
    assert result.device_facts is not None, result.message
    node = cpu_profile(read_node_facts(), result.device_facts)
    lacking = sorted(set(FEATURES) - node.features)[0]  # a feature this KVM does not offer (3dnow on PVM)
    have = sorted(node.features)[:5]

    def config(more: list[str]) -> str:
        profiles = {"here": {"features": have}, "more": {"features": more}}
        return yaml.safe_dump({"resources": [{"name": KVM, "devices": ["/dev/kvm"], "restore_profiles": profiles}]})

    features = tmp_path / "features.d"
    features.mkdir()
    d = daemon(config([*have, lacking]), env={"ATE_DEVPLUGIN_NFD_FEATURES_DIR": str(features)})
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    path = features / "ate-devplugin-kvm"

    def labels() -> dict[str, str]:
        text = path.read_text() if path.exists() else ""
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))

    wait_until(lambda: labels().get("ate.dev/restore_here") == "true", 10, "the answers as labels")
    assert labels()["ate.dev/restore_more"] == "false"
    answer = partial(d.metric, "ate_devplugin_kvm_restore_answer", resource_name=KVM, profile="more")
    assert answer(answer="missing-features") == 1
    said = [line["msg"] for line in d.log_lines() if line.get("msg", "").startswith("restore profile more")]
    assert said[-1] == f"restore profile more: not restorable: 1 feature missing: {lacking}"
    registrations = d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success")

    assert d.config_path is not None
    d.config_path.write_text(config(have))  # the lacking feature asked no more
    wait_until(lambda: labels().get("ate.dev/restore_more") == "true", 10, "the answer flipped")
    assert answer(answer="restorable") == 1
    assert d.running()
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == registrations
    print("restore labels:", {k: v for k, v in labels().items() if "restore_" in k})
