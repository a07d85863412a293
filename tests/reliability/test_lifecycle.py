"""The lifecycle under change (issue 10): config flips, foreign streams, sockets, signals,
config reloads that hang. Against the kubelet's real device manager where it is involved.

Each test failed on the supervisor of before the reconciler (see docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.faults import SilentPeer, SpawnDaemon, log_matches, soak_seconds
from tests.harness.kubelet import PLUGIN_DIR, KubeletBench, Namespace
from tests.harness.wait import wait_until

KVM, TUN = "ate.dev/kvm", "ate.dev/tun"
UNITS = 4096
SOCKET, TUN_SOCKET = "ate-ate-dev-kvm.sock", "ate-ate-dev-tun.sock"
KVM_ONLY = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"
KVM_AND_TUN = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tun, devices: [/dev/net/tun]}]\n"


def full(kubelet: KubeletBench, resource: str = KVM, units: int = UNITS, timeout: float = 30) -> None:
    kubelet.wait(resource, capacity=units, allocatable=units, timeout=timeout)


def replace(path: Path, text: str) -> None:
    """Writes ``path`` whole at once, as config tools do (a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def alive(d: DevicePluginDaemon) -> bool:
    return d.proc is not None and d.proc.poll() is None


# --- a config flipping fast ---------------------------------------------------------------


def test_rapid_config_flip_ends_in_the_final_state(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    """A resource added and removed every few ms for seconds: afterwards exactly the final
    config is served, events are still handled (a device removed reaches the kubelet as
    Unhealthy at once), and the probes say all is well because it is."""
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    d = daemon(KVM_ONLY)
    assert d.config_path is not None
    full(kubelet)
    flip_for = soak_seconds(3.0, 20.0)
    flips = 0
    end = time.monotonic() + flip_for
    while time.monotonic() < end:
        replace(d.config_path, KVM_AND_TUN if flips % 2 == 0 else KVM_ONLY)
        flips += 1
        time.sleep(0.003)
    replace(d.config_path, KVM_ONLY)
    # The final state: only kvm's socket, tun's series gone, kvm registered throughout.
    wait_until(lambda: kubelet_ns.sockets() == [SOCKET, "kubelet.sock"], 30, "only kvm's socket left")
    wait_until(lambda: math.isnan(d.metric("ate_devplugin_registered", resource_name=TUN)), 30, "tun's series gone")
    full(kubelet)
    wait_until(d.ready, 10, "readyz")
    assert d.get("/healthz")[0] == 200
    # Events are still handled: a device removed now reaches the kubelet at once.
    pending = kubelet.begin_wait(KVM, capacity=UNITS, allocatable=0, timeout=10)
    removed_ns = time.monotonic_ns()
    remove_device_node(device_root, "kvm")
    result = pending.result()
    took = (result.done_monotonic_ns - removed_ns) / 1e9
    print(f"{flips} config flips in {flip_for:.0f}s; then a device removed reached the kubelet in {took * 1000:.1f} ms")
    assert took < 1.0  # the bound; measured about 10 ms
    assert d.metric("ate_devplugin_lifecycle_stalls_total", reason="event_handling") == 0
    assert d.metric("ate_devplugin_lifecycle_stalls_total", reason="agent_stop") == 0
    assert alive(d)


# --- readiness follows the kubelet's own stream --------------------------------------------

_LIST_AND_WATCH = """
import sys, time, grpc
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb, api_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1])
for response in api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty()):
    print(len(response.devices), flush=True)
"""


@contextlib.contextmanager
def foreign_stream(ns: Namespace) -> Iterator[subprocess.Popen[str]]:
    """A local client (not the kubelet) holding a ListAndWatch stream on our socket."""
    target = f"unix://{ns.path(f'{PLUGIN_DIR}/{SOCKET}')}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _LIST_AND_WATCH, target], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(UNITS)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_readiness_follows_the_kubelets_own_stream(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """The kubelet drops our stream (its device manager stopped; the process stays) while
    another local client holds a stream of ours: /readyz must go 503 until the kubelet is
    back and holds a stream of its own again.

    (Registering again when the kubelet drops its stream while kubelet.sock stays is
    table-tested in tests/unit: the bench has no way to drop one stream alone.)
    """
    d = daemon()
    full(kubelet)
    wait_until(d.ready, 10, "readyz")
    with foreign_stream(kubelet_ns):
        wait_until(lambda: streams(d) == 2, 10, "the kubelet's and the foreign stream")
        kubelet.stop()
        wait_until(lambda: streams(d) == 1, 10, "the kubelet's stream gone")
        wait_until(lambda: not d.ready(), 10, "readyz 503 with only a foreign stream")
        assert d.metric("ate_devplugin_registered", resource_name=KVM) == 0
        kubelet.start()
        full(kubelet, timeout=30)
        wait_until(d.ready, 10, "readyz again")
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 2


def streams(d: DevicePluginDaemon) -> float:
    return d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM)


# --- sockets ---------------------------------------------------------------------------------


def test_socket_is_0600_whatever_the_umask(spawn_daemon: SpawnDaemon, device_root: Path, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    old = os.umask(0)
    try:
        d = spawn_daemon(device_root, plugin_dir=str(plugins))
    finally:
        os.umask(old)
    sock = plugins / SOCKET
    wait_until(sock.is_socket, 10, "our socket")
    mode = stat.S_IMODE(sock.stat().st_mode)
    print(f"socket mode under umask 000: {mode:o}")
    assert mode == 0o600
    assert alive(d)


@pytest.mark.parametrize("intruder", ["file", "symlink"])
def test_a_socket_renamed_over_is_served_again(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, intruder: str
) -> None:
    d = daemon()
    full(kubelet)
    sock = kubelet_ns.plugin_dir / SOCKET
    tmp = kubelet_ns.plugin_dir / "intruder"
    if intruder == "file":
        tmp.write_text("not a socket\n")
    else:
        tmp.symlink_to(sock)  # points at our socket, but is not it
    begin = time.monotonic()
    os.replace(tmp, sock)

    def registered() -> float | None:
        return d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success")

    wait_until(lambda: sock.is_socket() and not sock.is_symlink(), 10, "our socket made again")
    # The kubelet may still show the old registration full: wait for the new one first.
    wait_until(lambda: registered() == 2, 10, "registered again")
    full(kubelet)
    took = time.monotonic() - begin
    print(f"socket renamed over by a {intruder}: served and registered again in {took:.2f}s")
    assert registered() == 2  # once again, not more
    wait_until(d.ready, 10, "readyz")


def test_a_new_kubelet_socket_registers_at_once(
    kubelet_ns: Namespace, kubelet_version: str, daemon: MakeDaemon, tmp_path: Path
) -> None:
    """A kubelet.sock that never answers holds our Register (its timeout is 12 s); a new
    kubelet.sock must end that attempt and register at once."""
    with (
        SilentPeer(kubelet_ns.plugin_dir / "kubelet.sock", mode="hang") as peer,
        KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet,
    ):
        d = daemon()
        wait_until(lambda: peer.accepted >= 1, 10, "a Register attempt at the silent kubelet")
        begin = time.monotonic()
        kubelet.start()  # removes the silent peer's socket (its connection stays), makes kubelet.sock anew
        full(kubelet, timeout=6.0)  # well before the hanging attempt's 12 s timeout
        print(f"new kubelet.sock during a hanging Register: full {time.monotonic() - begin:.2f}s after")
    assert alive(d)


def test_chmod_of_the_kubelet_socket_is_not_a_restart(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    d = daemon()
    full(kubelet)
    os.chmod(kubelet_ns.plugin_dir / "kubelet.sock", 0o700)
    # Any later event makes the daemon look at kubelet.sock again; wait until one is handled.
    remove_device_node(device_root, "kvm")
    kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=10)
    assert d.metric("ate_devplugin_kubelet_restarts_total") == 0
    assert d.metric("ate_devplugin_registrations_total", resource_name=KVM, result="success") == 1
    assert kubelet.metrics()["registrations"].get(KVM) == 1


# --- signals ---------------------------------------------------------------------------------


def test_sighup_reloads_the_config(spawn_daemon: SpawnDaemon, device_root: Path, tmp_path: Path) -> None:
    """The config is a symlink into a directory the daemon does not watch, changed in
    place there: only SIGHUP tells the daemon to read it again."""
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.yaml").write_text(KVM_ONLY)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "config.yaml").symlink_to(elsewhere / "config.yaml")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    d = spawn_daemon(device_root, plugin_dir=str(plugins), args=["--config", str(etc / "config.yaml")])
    wait_until((plugins / SOCKET).is_socket, 10, "kvm's socket")
    (elsewhere / "config.yaml").write_text(KVM_AND_TUN)
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)
    wait_until((plugins / TUN_SOCKET).is_socket, 10, "tun served after SIGHUP")
    assert d.metric("ate_devplugin_config_reloads_total", result="success") == 1
    assert alive(d)


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGQUIT, signal.SIGINT, signal.SIGALRM])
def test_terminating_signals_leave_no_stale_socket(
    spawn_daemon: SpawnDaemon, device_root: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    d = spawn_daemon(device_root, plugin_dir=str(plugins))
    wait_until((plugins / SOCKET).is_socket, 10, "our socket")
    rc = d.stop(sig)
    print(f"{sig.name}: exit {rc}, sockets left {sorted(p.name for p in plugins.iterdir())}")
    assert rc == 0
    assert not (plugins / SOCKET).exists()
    assert log_matches(d.log_lines(), "stopped")


def test_sigusr1_writes_the_state_to_the_log_and_nothing_stops(
    spawn_daemon: SpawnDaemon, device_root: Path, tmp_path: Path
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    d = spawn_daemon(device_root, plugin_dir=str(plugins))
    wait_until((plugins / SOCKET).is_socket, 10, "our socket")
    assert d.proc is not None
    d.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: any(line.get("msg") == "state" for line in d.log_lines()), 10, "the state logged")
    (state,) = [line["state"] for line in d.log_lines() if line.get("msg") == "state"]
    print(f"SIGUSR1: {state}")
    assert alive(d)
    assert (plugins / SOCKET).is_socket()
    assert state["resources"]["ate.dev/kvm"] == {
        "devices": ["/dev/kvm 10:232"],
        "complete": True,
        "health": "every device node present",
    }
    assert set(state["components"]) == {"device plugin", "CDI specs", "kvm probe"}
    assert state["alive"] is True


def big_config(size: int) -> str:
    """A valid config of about ``size`` bytes that takes the YAML parser long to read."""
    line = "# " + "x" * 76 + "\n"
    return KVM_ONLY + line * (size // len(line))


def test_sigterm_during_a_large_reload_exits_within_5s(
    spawn_daemon: SpawnDaemon, device_root: Path, tmp_path: Path
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "config.yaml").write_text(KVM_ONLY)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    d = spawn_daemon(device_root, plugin_dir=str(plugins), args=["--config", str(etc / "config.yaml")])
    wait_until((plugins / SOCKET).is_socket, 10, "our socket")
    replace(etc / "config.yaml", big_config(8 * 1024 * 1024))
    time.sleep(1.0)  # the reload begins at once (the event), and lasts many seconds
    begin = time.monotonic()
    rc = d.stop(signal.SIGTERM, timeout=30)
    took = time.monotonic() - begin
    print(f"SIGTERM during an 8 MB reload: exit {rc} in {took:.2f}s")
    assert rc == 0
    assert took < 5.0
    assert not (plugins / SOCKET).exists()


# --- config reload: off the loop, bounded, last good config kept -----------------------------


def test_a_fifo_config_is_rejected_once_and_the_loop_stays_responsive(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    """The config path becomes a FIFO nobody writes: reading it would block for ever. The
    reload refuses it without reading (in a worker thread with a timeout besides), counts
    it once however many events it causes, keeps the running config, and the daemon keeps
    handling events meanwhile."""
    d = daemon(KVM_ONLY)
    assert d.config_path is not None
    full(kubelet)
    fifo = d.config_path.with_name("fifo")
    os.mkfifo(fifo)
    os.replace(fifo, d.config_path)
    try:
        # Events are handled while the read hangs: a device removed reaches the kubelet.
        remove_device_node(device_root, "kvm")
        kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=10)
        assert d.get("/healthz")[0] == 200
        wait_until(lambda: d.metric("ate_devplugin_config_reloads_total", result="failure") == 1, 20, "reload rejected")
        add_device_node(device_root, "kvm", "/dev/kvm")
        full(kubelet, timeout=10)
        assert d.get("/healthz")[0] == 200
        wait_until(d.ready, 10, "readyz with the last good config")
    finally:
        with contextlib.suppress(OSError):  # let the hanging read end
            os.close(os.open(d.config_path, os.O_WRONLY | os.O_NONBLOCK))
    assert alive(d)
