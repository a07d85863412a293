"""Faults around the kubelet, against its real device manager (issue 6, "Faults").

Each test repeats its fault a CI-sized number of times; ``ATE_SOAK_SCALE=full`` runs
the counts the issue names (see docs/reliability.md for the results of such runs).
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import add_device_node, make_device_root, remove_device_node
from tests.harness.faults import (
    Footprint,
    SpawnDaemon,
    is_read_only,
    log_matches,
    set_read_only,
    soak,
    soak_seconds,
)
from tests.harness.kubelet import PLUGIN_DIR, DeviceSpec, KubeletBench, Namespace
from tests.harness.wait import holds_for, wait_until

KVM = "ate.dev/kvm"
UNITS = 4096
SOCKET = "ate-ate-dev-kvm.sock"
KVM_SPEC = DeviceSpec(container_path="/dev/kvm", host_path="/dev/kvm", permissions="rw")

# Bounds on what the daemon may accumulate over a soak, measured after a warm-up (the
# first restarts create gRPC's threads and caches). The daemon holds a fixed set of
# files (inotify, epoll, sockets) and threads; any per-restart leak would exceed these
# within a few dozen restarts.
FD_SLACK = 4
THREAD_SLACK = 4
RSS_SLACK_KIB = 16 * 1024


def full(kubelet: KubeletBench, resource: str = KVM, units: int = UNITS, timeout: float = 30) -> None:
    kubelet.wait(resource, capacity=units, allocatable=units, timeout=timeout)


BARRIER = "ate.dev/barrier"
BARRIER_RESOURCE = f"  - {{name: {BARRIER}, devices: [/dev/barrier], units: 1}}\n"


def with_barrier(device_root: Path, resources: str) -> str:
    """A config of ``resources`` plus a one-unit resource whose node :func:`barrier` removes."""
    add_device_node(device_root, "barrier", "/dev/null")
    return "resources:\n" + resources + BARRIER_RESOURCE


def barrier(kubelet: KubeletBench, device_root: Path) -> None:
    """A positive signal that the daemon has caught up with the filesystem.

    The daemon reads the filesystem's state on every event. Once the kubelet sees the
    barrier node's removal, the daemon has read the state after the last change of the
    test: any event still queued reads the same state again, so every later update of
    another resource carries its final state. Each resource has its own stream, so the
    kubelet may see the barrier before another resource's last update: wait for that
    final state after the barrier, not before.
    """
    remove_device_node(device_root, "barrier")
    kubelet.wait(BARRIER, capacity=1, allocatable=0, timeout=30)


# --- kubelet restarts -----------------------------------------------------------------


def test_kubelet_restarts_in_a_row_lose_nothing(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    restarts = soak(6, 200)
    warmup = min(2, restarts - 1)
    d = daemon()
    full(kubelet)
    assert d.proc is not None
    pid = d.proc.pid
    allocated: dict[str, dict[str, list[str]]] = {}
    baseline: Footprint | None = None
    samples: list[Footprint] = []
    for i in range(restarts):
        pod = f"pod-{i}"
        alloc = kubelet.allocate(pod, "vm", {KVM: 1})
        assert alloc.devices == [KVM_SPEC], f"allocation {i}"
        allocated[pod] = alloc.device_ids
        kubelet.restart()
        full(kubelet)
        # The first and the latest allocation survive every restart.
        assert kubelet.devices("pod-0", "vm") == allocated["pod-0"], f"after restart {i + 1}"
        assert kubelet.devices(pod, "vm") == allocated[pod], f"after restart {i + 1}"
        if i + 1 == warmup:
            baseline = Footprint.of(pid)
        samples.append(Footprint.of(pid))
    # Every allocation made during the run is still held, unchanged.
    for pod, ids in allocated.items():
        assert kubelet.devices(pod, "vm") == ids, pod
    # Each kubelet seen once, registered once per kubelet.
    assert d.metric("ate_devplugin_kubelet_restarts_total") == restarts
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == restarts + 1
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    wait_until(d.ready, 10, "readyz after the last restart")
    assert d.proc.poll() is None
    # No growth in open files, threads or memory.
    assert baseline is not None
    end = Footprint.of(pid)
    print(f"{restarts} kubelet restarts: footprint after warm-up {baseline}, at the end {end}")
    assert end.fds <= baseline.fds + FD_SLACK, (baseline, end, end.fd_targets(pid))
    assert end.threads <= baseline.threads + THREAD_SLACK, (baseline, end)
    assert end.rss_kib <= baseline.rss_kib + RSS_SLACK_KIB, (baseline, end)
    assert max(s.fds for s in samples) <= baseline.fds + FD_SLACK, samples


# --- our daemon killed ----------------------------------------------------------------


def test_daemon_sigkilled_again_and_again(kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon) -> None:
    kills = soak(4, 50)
    d = daemon()
    full(kubelet)
    first = kubelet.allocate("pod-first", "vm", {KVM: 1}).device_ids
    for i in range(kills):
        d.stop(signal.SIGKILL)
        assert SOCKET in kubelet_ns.sockets(), f"kill {i + 1}: the socket stays behind"
        kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=30)
        d.start()  # binds over the stale socket
        full(kubelet)
        assert kubelet.allocate(f"pod-{i}", "vm", {KVM: 1}).devices == [KVM_SPEC], f"after kill {i + 1}"
    assert kubelet.devices("pod-first", "vm") == first
    print(f"{kills} SIGKILLs: back to full after each, stale socket replaced each time")
    assert kubelet_ns.sockets() == ["ate-ate-dev-kvm.sock", "kubelet.sock"]
    # The kubelet saw one registration per daemon start.
    assert kubelet.metrics()["registrations"].get(KVM) == kills + 1
    wait_until(d.ready, 10, "readyz")


# --- device nodes flapping ------------------------------------------------------------


@pytest.mark.parametrize("end_present", [True, False], ids=["ends-present", "ends-absent"])
def test_device_node_flapping_ends_right(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path, end_present: bool
) -> None:
    flaps = soak(150, 500)
    d = daemon(with_barrier(device_root, "  - {name: ate.dev/kvm, devices: [/dev/kvm]}\n"))
    full(kubelet)
    full(kubelet, BARRIER, 1)
    for _ in range(flaps):  # as fast as the file system goes: no waiting in between
        remove_device_node(device_root, "kvm")
        add_device_node(device_root, "kvm", "/dev/kvm")
    if not end_present:
        remove_device_node(device_root, "kvm")
    expected = UNITS if end_present else 0
    barrier(kubelet, device_root)
    kubelet.wait(KVM, capacity=UNITS, allocatable=expected, timeout=30)
    assert d.metric("ate_devplugin_device_nodes_present", resource_name=KVM) == (1 if end_present else 0)
    assert d.metric("ate_devplugin_devices", resource_name=KVM, health="healthy") == expected
    assert d.running()
    assert d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM) == 1
    updates = d.metric("ate_devplugin_list_and_watch_updates_total", resource_name=KVM)
    print(f"{flaps} node flaps: {updates:.0f} updates sent, final allocatable {expected} as expected")
    # The stream the kubelet holds is the first one: flapping never dropped it.
    assert kubelet.metrics()["registrations"].get(KVM) == 1
    if end_present:
        assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]


def test_device_directory_flapping_ends_right(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    """A node in a sub-directory, the directory itself removed and made again each time:
    the daemon must move its watch to the new directory without missing the node."""
    flaps = soak(60, 500)
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    d = daemon(with_barrier(device_root, "  - {name: ate.dev/tun, devices: [/dev/net/tun], units: 16}\n"))
    full(kubelet, "ate.dev/tun", 16)
    full(kubelet, BARRIER, 1)
    for _ in range(flaps):
        shutil.rmtree(device_root / "net")
        add_device_node(device_root, "net/tun", "/dev/net/tun")  # makes the directory too
    barrier(kubelet, device_root)
    kubelet.wait("ate.dev/tun", capacity=16, allocatable=16, timeout=30)
    # And the watch really is on the new directory: a change there is still seen.
    remove_device_node(device_root, "net/tun")
    kubelet.wait("ate.dev/tun", capacity=16, allocatable=0, timeout=30)
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    full(kubelet, "ate.dev/tun", 16)
    assert d.running()
    print(f"{flaps} directory flaps: final state right, watch follows the new directory")


# --- the kubelet away, its directory away or read-only ---------------------------------


def test_kubelet_absent_for_a_while_at_start(
    kubelet_ns: Namespace, kubelet_version: str, daemon: MakeDaemon, tmp_path: Path
) -> None:
    absent = soak_seconds(2.0, 30.0)
    d = daemon()
    holds_for(lambda: not d.ready(), absent, "unready while there is no kubelet")
    # Waiting for the socket is not hammering it: no attempt, one log line.
    attempts = sum(
        d.metric("ate_devplugin_registrations_total", resource_name=KVM, result=r)
        for r in ("success", "unavailable", "timeout", "rejected", "error")
    )
    assert attempts == 0
    assert len(log_matches(d.log_lines(), "waiting for the kubelet socket", level="info")) == 1
    with KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet:
        kubelet.start()
        full(kubelet)
        wait_until(d.ready, 10, "readyz")
        assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1
    print(f"kubelet absent {absent:.0f}s: 0 attempts meanwhile, registered once it came")


def _serve_failures(d: DevicePluginDaemon) -> int:
    return len(log_matches(d.log_lines(), "cannot serve on", level="error"))


def test_plugin_directory_missing_then_created(
    bare_ns: Namespace, kubelet_version: str, spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    """No /var/lib/kubelet at all when the daemon starts (a node whose kubelet never ran).

    The daemon must watch the nearest existing parent and, once the kubelet makes the
    directory and its socket, serve and register at once: not when some retry timer
    happens to fire. To tell the two apart without a race, the directory stays missing
    until the daemon has failed to serve 9 times: its backoff (0.02 s doubling, each
    delay drawn from [d/2, d]) then sleeps at least 2.56 s before the next try, so a
    daemon that reacts to the directory's creation is full well within that.
    """
    root = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    d = spawn_daemon(root, ns=bare_ns)
    failures = 9
    wait_until(lambda: _serve_failures(d) >= failures, 30, f"{failures} failed attempts to serve")
    missing_for = soak_seconds(0.0, 30.0)
    holds_for(lambda: not d.ready() and d.running(), missing_for, "running, unready, no plugin dir")
    assert not bare_ns.path("/var/lib/kubelet").exists()
    with KubeletBench(bare_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet:
        begin = time.monotonic()
        kubelet.start()  # makes /var/lib/kubelet/device-plugins, then kubelet.sock
        full(kubelet, timeout=2.0)
        print(
            f"plugin dir missing {missing_for:.0f}s after 9 failed serves: full {time.monotonic() - begin:.2f}s after"
        )
        wait_until(d.ready, 10, "readyz")
        assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1


def test_plugin_directory_read_only_then_writable(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """The kubelet is up, but the plugin directory is mounted read-only (a bind mount
    remounted ``ro``: chmod would not stop root). The daemon cannot make its socket: it
    must keep trying with backoff, stay unready, not die, and serve once writable."""
    set_read_only(kubelet_ns, PLUGIN_DIR, True)
    assert is_read_only(kubelet_ns, PLUGIN_DIR)
    d = daemon()
    read_only_for = soak_seconds(1.5, 30.0)
    started = time.monotonic()
    holds_for(lambda: not d.ready() and d.running(), read_only_for, "running, unready, read-only dir")
    lines = d.log_lines()
    assert not log_matches(lines, "died"), "an agent died on a read-only directory"
    tries = _serve_failures(d)
    assert tries >= 1
    set_read_only(kubelet_ns, PLUGIN_DIR, False)
    writable = time.monotonic()
    # No file system event tells of a remount: the next retry finds the directory
    # writable. The wait covers the longest backoff delay the read-only time can reach.
    full(kubelet, timeout=min(35.0, 2 * (time.monotonic() - started) + 5))
    print(f"read-only {read_only_for:.0f}s: {tries} tries, full {time.monotonic() - writable:.2f}s after rw")
    wait_until(d.ready, 10, "readyz")
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]


def test_sigterm_with_a_read_only_plugin_directory(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """Registered, then the directory turns read-only: our socket cannot be removed on
    SIGTERM. The daemon must still stop cleanly, in time, saying why the socket stays."""
    d = daemon()
    full(kubelet)
    set_read_only(kubelet_ns, PLUGIN_DIR, True)
    begin = time.monotonic()
    rc = d.stop()
    took = time.monotonic() - begin
    assert rc == 0, d.log_text()[-3000:]
    print(f"SIGTERM with a read-only plugin dir: exit {rc} in {took:.2f}s")
    assert took < 5.0
    assert log_matches(d.log_lines(), "stopped")


def test_stale_foreign_file_at_our_socket_path(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """A regular file (not a socket) left where our socket goes: the daemon replaces it."""
    (kubelet_ns.plugin_dir / SOCKET).write_text("left over\n")
    d = daemon()
    full(kubelet)
    assert SOCKET in kubelet_ns.sockets()
    wait_until(d.ready, 10, "readyz")
