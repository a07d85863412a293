"""The kubelet bench against the kubelet's own Go stub device plugin.

These tests check the bench itself (and document upstream behaviour) before it is used
against our daemon: both peers are upstream code, so a failure here is a harness bug or
a behaviour change between releases.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.devices import make_device_root
from tests.harness.kubelet import (
    KUBELET_SOCKET,
    PLUGIN_DIR,
    BenchError,
    GoStubPlugin,
    KubeletBench,
    Namespace,
    WaitTimeoutError,
)

pytestmark = pytest.mark.kubelet

RES = "example.com/stub"
StubFactory = Callable[..., GoStubPlugin]

# The Go stub's restart watch waits a fixed 10 s after kubelet.sock reappears before it
# restarts its server and registers again (wait.PollUntilContextTimeout, not immediate).
STUB_REREGISTER_DELAY_S = 10.0


def test_bench_reports_pinned_release(kubelet: KubeletBench, kubelet_version: str) -> None:
    assert kubelet.info["built_for"] == kubelet_version
    assert kubelet.info["k8s_version"].startswith(f"v{kubelet_version}.")
    assert kubelet.info["socket"] == KUBELET_SOCKET
    assert kubelet.ns.sockets() == ["kubelet.sock"]


def test_registration_sets_capacity(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=3)
    got = kubelet.wait(RES, capacity=3, allocatable=3, timeout=10)
    assert got.present
    cap = kubelet.capacity()
    assert cap.of(RES) == (3, 3)
    assert cap.removed == []
    assert kubelet.allocatable_devices() == {RES: stub.device_ids}
    assert kubelet.metrics()["registrations"] == {RES: 1.0}
    assert sorted(kubelet.ns.sockets()) == sorted(["kubelet.sock", Path(stub.socket).name])


def test_allocate_returns_devices_and_runtime_options(
    kubelet: KubeletBench, go_stub: StubFactory, tmp_path: Path
) -> None:
    # Host paths handed out must exist only as far as the runtime cares; make real nodes anyway.
    make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    go_stub(RES, devices=3, device_node="/dev/kvm")
    kubelet.wait(RES, allocatable=3)

    a = kubelet.allocate("pod-a", "main", {RES: 2})
    ids = a.device_ids[RES]
    assert len(ids) == 2
    assert set(ids) <= {"dev-0", "dev-1", "dev-2"}
    assert a.envs == {"STUB_RESOURCE": RES, "STUB_DEVICE_IDS": ",".join(ids)}
    assert a.annotations == {"kubelet-bench.stub/devices": ",".join(ids)}
    assert sorted((d.container_path, d.host_path, d.permissions) for d in a.devices) == [
        (f"/dev/stub/{i}", "/dev/kvm", "rw") for i in ids
    ]
    assert a.mounts == []
    assert a.cdi_devices == []
    assert kubelet.devices("pod-a", "main") == {RES: ids}
    assert kubelet.metrics()["alloc_duration"][RES]["count"] == 1

    # Capacity does not shrink with allocations: the scheduler subtracts them.
    assert kubelet.capacity().of(RES) == (3, 3)

    b = kubelet.allocate("pod-b", "main", {RES: 1})
    assert set(b.device_ids[RES]).isdisjoint(ids)

    with pytest.raises(BenchError, match="requested number of devices unavailable"):
        kubelet.allocate("pod-c", "main", {RES: 1})
    # An error answer leaves the bench running, and the rejected pod is not active.
    assert [p["uid"] for p in kubelet.pods()] == ["pod-a", "pod-b"]

    # A terminated pod's devices are freed at the next allocation.
    assert kubelet.remove_pod("pod-a")
    c = kubelet.allocate("pod-c", "main", {RES: 2})
    assert sorted(c.device_ids[RES]) == sorted(ids)


def test_unknown_resource_and_bad_requests_are_errors(kubelet: KubeletBench) -> None:
    # A resource no plugin ever registered is not a device plugin resource: nothing to do.
    a = kubelet.allocate("pod-x", "main", {"example.com/none": 1})
    assert a.device_ids == {}
    with pytest.raises(BenchError, match="unknown cmd"):
        kubelet.request("no-such-command")
    with pytest.raises(BenchError, match="unknown field"):
        kubelet.request("capacity", bogus=1)
    with pytest.raises(BenchError, match="already started"):
        kubelet.start()


def test_preferred_allocation_is_followed(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    go_stub(RES, devices=4, preferred=True)
    kubelet.wait(RES, allocatable=4)
    a = kubelet.allocate("pod-a", "main", {RES: 2})
    assert a.device_ids[RES] == ["dev-2", "dev-3"]  # the stub prefers the highest IDs


def test_health_update_changes_allocatable_only(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=3)
    kubelet.wait(RES, allocatable=3)
    stub.set_health(unhealthy=["dev-1"])
    kubelet.wait(RES, capacity=3, allocatable=2)
    assert kubelet.allocatable_devices() == {RES: ["dev-0", "dev-2"]}
    stub.set_health(unhealthy=[])
    kubelet.wait(RES, capacity=3, allocatable=3)


def test_plugin_death_keeps_capacity_drops_allocatable(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=2)
    kubelet.wait(RES, allocatable=2)
    stub.kill()
    # Stream end: all devices unhealthy, capacity kept for the 5 minute grace period.
    kubelet.wait(RES, capacity=2, allocatable=0, timeout=10)
    with pytest.raises(BenchError, match=r"no healthy devices|has been stopped"):
        kubelet.allocate("pod-a", "main", {RES: 1})


def test_begin_wait_times_an_event_triggered_after_it(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=2)
    kubelet.wait(RES, allocatable=2)
    pending = kubelet.begin_wait(RES, allocatable=0, timeout=10)
    with pytest.raises(RuntimeError, match="pending"):
        kubelet.capacity()
    killed_ns = time.monotonic_ns()
    stub.kill()
    got = pending.result()
    # Both sides read CLOCK_MONOTONIC: the latency from the kill is directly measurable.
    assert got.done_monotonic_ns > killed_ns > pending.sent_monotonic_ns
    assert 0 < (got.done_monotonic_ns - killed_ns) / 1e9 < 5
    assert (got.capacity, got.allocatable) == (2, 0)
    assert kubelet.capacity().of(RES) == (2, 0)


def test_plugin_restart_restores_allocatable_and_keeps_assignment(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=2)
    kubelet.wait(RES, allocatable=2)
    ids = kubelet.allocate("pod-a", "main", {RES: 1}).device_ids[RES]
    stub.stop()
    kubelet.wait(RES, capacity=2, allocatable=0)
    go_stub(RES, devices=2)
    kubelet.wait(RES, capacity=2, allocatable=2, timeout=10)
    assert kubelet.devices("pod-a", "main") == {RES: ids}
    assert kubelet.metrics()["registrations"] == {RES: 2.0}


@pytest.mark.parametrize("in_process", [False, True], ids=["process-restart", "in-process-restart"])
def test_kubelet_restart_stub_reregisters_after_its_fixed_delay(
    kubelet: KubeletBench, go_stub: StubFactory, in_process: bool
) -> None:
    stub = go_stub(RES, devices=2)
    kubelet.wait(RES, allocatable=2)
    ids = kubelet.allocate("pod-a", "main", {RES: 1}).device_ids[RES]
    stub_socket = Path(stub.socket).name
    assert (kubelet.ns.plugin_dir / "kubelet_internal_checkpoint").is_file()

    started = kubelet.restart(in_process=in_process)

    # The new manager wiped the stub's socket, listens again and read its checkpoint.
    assert started["checkpoint_found"] is True
    assert stub_socket not in kubelet.ns.sockets()
    # Right after the restart the resource is known (from the checkpoint) with capacity 0.
    cap = kubelet.capacity()
    assert cap.of(RES) == (0, 0)
    assert RES in cap.capacity
    # The running pod keeps its devices across the restart.
    assert kubelet.devices("pod-a", "main") == {RES: ids}

    # The Go stub watches for kubelet.sock, and comes back only after its fixed delay.
    got = kubelet.wait(RES, capacity=2, allocatable=2, timeout=STUB_REREGISTER_DELAY_S + 20)
    assert got.elapsed_s >= STUB_REREGISTER_DELAY_S - 1.0
    assert stub.pid is not None
    assert stub_socket in kubelet.ns.sockets()
    # Only the other device is left for a new pod.
    b = kubelet.allocate("pod-b", "main", {RES: 1})
    assert b.device_ids[RES] != ids
    assert kubelet.devices("pod-a", "main") == {RES: ids}


def test_kubelet_restart_stub_without_watch_stays_gone(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    stub = go_stub(RES, devices=2, watch=False)
    kubelet.wait(RES, allocatable=2)
    kubelet.restart()
    with pytest.raises(WaitTimeoutError):
        kubelet.wait(RES, allocatable=2, timeout=2)
    # Registering again without serving on a new socket cannot work: the kubelet wiped
    # the socket file, so its dial back to the plugin times out (after 10 s).
    with pytest.raises(BenchError, match="failed to dial device plugin"):
        stub.register()
    assert kubelet.capacity().of(RES) == (0, 0)


def test_pods_listed_at_start_keep_devices_others_are_freed(kubelet: KubeletBench, go_stub: StubFactory) -> None:
    go_stub(RES, devices=2)
    kubelet.wait(RES, allocatable=2)
    a = kubelet.allocate("pod-a", "main", {RES: 1}).device_ids[RES]
    kubelet.allocate("pod-b", "main", {RES: 1})
    kubelet.kill()
    # Only pod-a survived the kubelet's downtime.
    kubelet.start(active_pods=["pod-a"])
    kubelet.wait(RES, allocatable=2, timeout=STUB_REREGISTER_DELAY_S + 20)
    c = kubelet.allocate("pod-c", "main", {RES: 1}).device_ids[RES]
    assert c != a
    assert kubelet.devices("pod-b", "main") == {}


def test_host_var_lib_is_untouched(kubelet_version: str, tmp_path: Path) -> None:
    before = sorted(os.listdir("/var/lib"))
    had_kubelet_dir = os.path.exists("/var/lib/kubelet")
    with Namespace() as ns, KubeletBench(ns, kubelet_version, log_dir=tmp_path) as bench:
        bench.start()
        assert ns.path(KUBELET_SOCKET).exists()
        stub = GoStubPlugin(ns, kubelet_version, RES, devices=1, log_dir=tmp_path).start()
        bench.wait(RES, allocatable=1)
        stub.stop()
        assert ns.path(PLUGIN_DIR).is_dir()
    assert sorted(os.listdir("/var/lib")) == before
    assert os.path.exists("/var/lib/kubelet") == had_kubelet_dir
