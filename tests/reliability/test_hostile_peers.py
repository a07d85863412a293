"""Peers that misbehave: a kubelet that never answers or refuses, callers that flood,
stall or send garbage, and SIGTERM in the middle of it all (issue 6)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from ate_devplugin.settings import Timing
from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.faults import Footprint, SilentPeer, log_matches, min_backoff_attempts, soak, soak_seconds
from tests.harness.kubelet import KUBELET_SOCKET, PLUGIN_DIR, DeviceSpec, KubeletBench, Namespace
from tests.harness.otlp import OtlpReceiver
from tests.harness.wait import holds_for, wait_until

KVM = "ate.dev/kvm"
UNITS = 4096
SOCKET = "ate-ate-dev-kvm.sock"
KVM_SPEC = DeviceSpec(container_path="/dev/kvm", host_path="/dev/kvm", permissions="rw")
RESULTS = ("success", "unavailable", "timeout", "rejected", "error")


def full(kubelet: KubeletBench, resource: str = KVM, units: int = UNITS, timeout: float = 30) -> None:
    kubelet.wait(resource, capacity=units, allocatable=units, timeout=timeout)


def registrations(d: DevicePluginDaemon, result: str, resource: str = KVM) -> float:
    return d.metric("ate_devplugin_registrations_total", resource_name=resource, result=result)


def plugin_target(ns: Namespace, name: str = SOCKET) -> str:
    """A gRPC target for one of our sockets inside ``ns``, reachable from this process."""
    return f"unix://{ns.path(f'{PLUGIN_DIR}/{name}')}"


def allocate_request(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


def otlp_env(otlp: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        # A burst must not overflow the span queue: what is tested is the flush on exit.
        "OTEL_BSP_MAX_QUEUE_SIZE": "65536",
    }


# --- a kubelet that never answers, or refuses ------------------------------------------


def test_register_hanging_is_bounded_then_recovers(
    kubelet_ns: Namespace, kubelet_version: str, daemon: MakeDaemon, tmp_path: Path
) -> None:
    """kubelet.sock accepts and reads but never answers: each Register ends at its
    deadline, the daemon stays unready, and recovers once a real kubelet comes."""
    hang_for = soak_seconds(1.0, 60.0)
    register_timeout = Timing().register_timeout_s
    with SilentPeer(kubelet_ns.path(KUBELET_SOCKET), mode="hang") as peer:
        d = daemon()
        wait_until(lambda: peer.accepted >= 1, 10, "the daemon dialing the silent kubelet")
        holds_for(lambda: not d.ready(), hang_for, "unready while Register hangs")
        assert registrations(d, "success") == 0
        # Attempts are bounded by the Register deadline plus the backoff between them.
        most = int(hang_for // register_timeout) + 1
        assert 1 <= peer.accepted <= most + 1, peer.accepted
        with KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet:
            kubelet.start()  # wipes the silent socket and listens on a new kubelet.sock
            # Recovery without a restart; that the new kubelet.sock ends the hanging attempt at
            # once is test_lifecycle's test_a_new_kubelet_socket_registers_at_once.
            full(kubelet, timeout=30)
            wait_until(d.ready, 10, "readyz")
            assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]
    # Attempts that ran out are counted as timeouts (none when the hang was shorter).
    assert registrations(d, "timeout") >= int(hang_for // register_timeout)
    assert registrations(d, "success") == 1
    assert d.running()
    print(f"Register hanging {hang_for:.0f}s: {registrations(d, 'timeout'):.0f} timeouts, {peer.accepted} dials")


def test_register_refused_backs_off_then_recovers(
    kubelet_ns: Namespace, kubelet_version: str, daemon: MakeDaemon, tmp_path: Path
) -> None:
    """kubelet.sock accepts and closes every connection: retries are capped exponential
    backoff (not a busy loop), one log line each, unready meanwhile."""
    refuse_for = soak_seconds(3.0, 60.0)
    with SilentPeer(kubelet_ns.path(KUBELET_SOCKET), mode="close") as peer:
        d = daemon()
        begin = time.monotonic()
        wait_until(lambda: registrations(d, "unavailable") >= 2, 10, "two refused registrations")
        holds_for(lambda: not d.ready(), refuse_for - (time.monotonic() - begin), "unready while Register is refused")

        def counted_and_logged() -> tuple[float, list[dict[str, object]]] | None:
            """The failures counted and their log lines, read between two attempts (the
            counter goes up just before the line is written, so one read can fall between)."""
            before = sum(registrations(d, r) for r in RESULTS if r != "success")
            lines = log_matches(d.log_lines(), "registration failed, retrying in")
            after = sum(registrations(d, r) for r in RESULTS if r != "success")
            return (after, lines) if before == after == len(lines) else None

        found = wait_until(counted_and_logged, 10, "as many log lines as failures counted")
        assert found is not None  # wait_until returns a true value
        failed, lines = found
        elapsed = time.monotonic() - begin
        assert 2 <= failed <= min_backoff_attempts(elapsed) + 1, (failed, elapsed)
        # The announced delays grow, and stay under the 30 s cap.
        delays = [float(str(line["msg"]).split("retrying in ")[1].split("s:")[0]) for line in lines]
        assert delays[-1] > delays[0]
        assert max(delays) <= 30.0
        print(f"Register refused {elapsed:.1f}s: {failed:.0f} attempts, delays {delays[0]:.3f}s .. {delays[-1]:.3f}s")
        assert peer.accepted >= 1
    with KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs") as kubelet:
        kubelet.start()
        # The new kubelet.sock wakes the daemon from its backoff sleep.
        full(kubelet, timeout=10)
        wait_until(d.ready, 10, "readyz")
    assert registrations(d, "success") == 1


# --- callers that flood, stall, or never speak ----------------------------------------

_STALLED_LIST_AND_WATCH = """
import sys, time, grpc
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb, api_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1])
stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
first = next(stream)
print(len(first.devices), flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def stalled_list_and_watch(ns: Namespace) -> Iterator[subprocess.Popen[str]]:
    """A ListAndWatch client that takes the first list and then stops reading: the
    process is stopped (SIGSTOP), so not even gRPC's own threads read for it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALLED_LIST_AND_WATCH, plugin_target(ns)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(UNITS)
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc
    finally:
        proc.kill()
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(10)


async def _allocate_concurrently(target: str, callers: int, calls_each: int) -> list[grpc.StatusCode]:
    async def caller(n: int) -> list[grpc.StatusCode]:
        codes = []
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            for i in range(calls_each):
                try:
                    await stub.Allocate(allocate_request(f"kvm-{(n * calls_each + i) % UNITS}"), timeout=30)
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code())
        return codes

    results = await asyncio.gather(*(caller(n) for n in range(callers)))
    return [c for r in results for c in r]


def test_none_of_flood_stall_or_silence_blocks_the_others(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    d = daemon()
    full(kubelet)
    with contextlib.ExitStack() as stack:
        stack.enter_context(stalled_list_and_watch(kubelet_ns))
        # Connections that never send a byte: to /metrics and to our gRPC socket.
        for _ in range(8):
            stack.enter_context(socket.create_connection(("127.0.0.1", d.port)))
            u = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            u.connect(str(kubelet_ns.path(f"{PLUGIN_DIR}/{SOCKET}")))
        wait_until(
            lambda: d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM) == 2,
            10,
            "the kubelet's stream and the stalled one",
        )
        # Device changes go out while one stream does not read: each full list is
        # ~80 KB, so a few fill every buffer towards the stalled client.
        for _ in range(soak(6, 40)):
            remove_device_node(device_root, "kvm")
            kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=30)
            add_device_node(device_root, "kvm", "/dev/kvm")
            full(kubelet)
        # 64 callers at once, each on its own connection.
        calls_each = soak(4, 40)
        codes = asyncio.run(_allocate_concurrently(plugin_target(kubelet_ns), 64, calls_each))
        assert codes == [grpc.StatusCode.OK] * (64 * calls_each)
        assert d.metric("ate_devplugin_allocate_requests_total", resource_name=KVM, code="OK") == 64 * calls_each
        # Probes and metrics still answer, and the kubelet still allocates.
        assert d.get("/metrics")[0] == 200
        assert d.ready()
        assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]
        # A stalled client does not hold up shutdown either.
        begin = time.monotonic()
        assert d.stop() == 0
        took = time.monotonic() - begin
        assert took < 5.0
        assert SOCKET not in kubelet_ns.sockets()
        print(f"64 callers x {calls_each} Allocate with a stalled stream: all OK; SIGTERM exit in {took:.2f}s")


def test_a_stalled_stream_cut_at_shutdown_logs_no_traceback(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    """A stream stuck in a write (its client stopped reading) is cut at shutdown; that
    is an expected event, not an internal error with a traceback in the log."""
    d = daemon()
    full(kubelet)
    with stalled_list_and_watch(kubelet_ns):
        for _ in range(6):
            remove_device_node(device_root, "kvm")
            kubelet.wait(KVM, capacity=UNITS, allocatable=0, timeout=30)
            add_device_node(device_root, "kvm", "/dev/kvm")
            full(kubelet)
        d.stop()
    tracebacks = [line for line in d.log_lines() if "exc" in line]
    assert tracebacks == []


# --- malformed and hostile requests ---------------------------------------------------


def _status(call: Callable[..., Any], request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _unary(channel: grpc.Channel, method: str, payload: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}", request_serializer=None, response_deserializer=None)
    return _status(call, payload)


def test_malformed_and_hostile_requests_get_the_right_status(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, device_root: Path
) -> None:
    add_device_node(device_root, "net/tun", "/dev/net/tun")
    d = daemon(
        "resources:\n"
        "  - {name: ate.dev/kvm, devices: [/dev/kvm]}\n"
        "  - {name: ate.dev/tun, devices: [/dev/net/tun], units: 8}\n"
    )
    full(kubelet)
    full(kubelet, "ate.dev/tun", 8)
    big = 300_000  # ~3.3 MB of unknown IDs: under the 4 MiB message limit, over kvm's request bound
    too_big = 500_000  # ~5.4 MB: over it
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    # Larger than the kubelet can send kvm (every unit ID twice, ~80 KB): refused unread.
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    allocate_cases: list[tuple[str, pb.AllocateRequest, grpc.StatusCode]] = [
        ("unknown ID", allocate_request("kvm-4096"), invalid),
        ("not an ID at all", allocate_request("../../etc/passwd"), invalid),
        ("empty request", pb.AllocateRequest(), invalid),
        ("empty container request", allocate_request(), invalid),
        ("duplicated ID", allocate_request("kvm-1", "kvm-1"), invalid),
        ("another resource's ID", allocate_request("tun-0"), invalid),
        ("empty string ID", allocate_request(""), invalid),
        ("one huge ID", allocate_request("kvm-" + "9" * (1 << 20)), exhausted),
        ("huge list of unknown IDs", allocate_request(*[f"x-{n}" for n in range(big)]), exhausted),
        ("huge list, one unknown", allocate_request(*[f"kvm-{n}" for n in range(UNITS)], "kvm-x"), invalid),
        ("every ID twice", allocate_request(*[f"kvm-{n}" for n in range(UNITS)] * 2), invalid),
        (
            "a bad container among good ones",
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["kvm-0"]),
                    pb.ContainerAllocateRequest(devices_ids=["tun-1"]),
                ]
            ),
            invalid,
        ),
        (
            "over the message limit",
            allocate_request(*[f"x-{n}" for n in range(too_big)]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
    ]
    preferred = pb.ContainerPreferredAllocationRequest
    preferred_cases: list[tuple[str, pb.PreferredAllocationRequest, grpc.StatusCode]] = [
        (
            "unknown available ID",
            pb.PreferredAllocationRequest(
                container_requests=[preferred(available_deviceIDs=["gpu-0"], allocation_size=1)]
            ),
            invalid,
        ),
        (
            "size over what is available",
            pb.PreferredAllocationRequest(
                container_requests=[preferred(available_deviceIDs=["kvm-0"], allocation_size=2)]
            ),
            invalid,
        ),
        (
            "negative size",
            pb.PreferredAllocationRequest(
                container_requests=[preferred(available_deviceIDs=["kvm-0"], allocation_size=-1)]
            ),
            invalid,
        ),
        (
            "duplicated available IDs",
            pb.PreferredAllocationRequest(
                container_requests=[preferred(available_deviceIDs=["kvm-0", "kvm-0"], allocation_size=1)]
            ),
            invalid,
        ),
        (
            "another resource's must-include ID",
            pb.PreferredAllocationRequest(
                container_requests=[
                    preferred(available_deviceIDs=["kvm-0"], must_include_deviceIDs=["tun-0"], allocation_size=1)
                ]
            ),
            invalid,
        ),
    ]
    got: dict[str, grpc.StatusCode] = {}
    want: dict[str, grpc.StatusCode] = {}
    with grpc.insecure_channel(plugin_target(kubelet_ns)) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        for name, request, code in allocate_cases:
            want[f"Allocate: {name}"] = code
            got[f"Allocate: {name}"] = _status(stub.Allocate, request)
        for name, prequest, code in preferred_cases:
            want[f"GetPreferredAllocation: {name}"] = code
            got[f"GetPreferredAllocation: {name}"] = _status(stub.GetPreferredAllocation, prequest)
        # Bytes that are no protobuf message, and a method that does not exist.
        # gRPC Python itself answers a request it cannot parse (the servicer never runs).
        want["Allocate: undecodable bytes"] = grpc.StatusCode.UNKNOWN
        got["Allocate: undecodable bytes"] = _unary(channel, "Allocate", b"\xff\xff\xff\xff\x0f")
        want["unknown method"] = grpc.StatusCode.UNIMPLEMENTED
        got["unknown method"] = _unary(channel, "Destroy", b"")
        # Still serving, right after all of that.
        assert stub.Allocate(allocate_request("kvm-0"), timeout=30).container_responses
    assert got == want
    refused = sum(1 for k, c in want.items() if k.startswith("Allocate: ") and c == invalid)
    assert d.metric("ate_devplugin_allocate_requests_total", resource_name=KVM, code="INVALID_ARGUMENT") == refused
    assert d.running()
    assert d.metric("ate_devplugin_list_and_watch_streams", resource_name=KVM) == 1
    assert kubelet.allocate("pod-a", "vm", {KVM: 1, "ate.dev/tun": 1}).devices
    assert kubelet.capacity().of(KVM) == (UNITS, UNITS)


def test_absurd_requests_are_refused_while_others_are_served(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """Thousands of container requests in one call (the kubelet sends one) are refused
    before any per-container work (INVALID_ARGUMENT; RESOURCE_EXHAUSTED unread when larger
    than the kubelet can send), and a well-formed caller is answered all along."""
    d = daemon()
    full(kubelet)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    many_allocate = [pb.ContainerAllocateRequest(devices_ids=[f"kvm-{n % UNITS}"]) for n in range(100_000)]
    many_preferred = [
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=["kvm-0", "kvm-1"], allocation_size=1)
    ] * 50_000
    cases: dict[str, tuple[str, bytes]] = {
        "Allocate, 2,000 container requests": (
            "Allocate",
            pb.AllocateRequest(container_requests=many_allocate[:2000]).SerializeToString(),
        ),
        "Allocate, 100,000 container requests": (
            "Allocate",
            pb.AllocateRequest(container_requests=many_allocate).SerializeToString(),
        ),
        "GetPreferredAllocation, 50,000 container requests": (
            "GetPreferredAllocation",
            pb.PreferredAllocationRequest(container_requests=many_preferred).SerializeToString(),
        ),
        "GetPreferredAllocation, 100,000 available IDs": (
            "GetPreferredAllocation",
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[f"kvm-{n % UNITS}" for n in range(100_000)], allocation_size=1
                    )
                ]
            ).SerializeToString(),
        ),
    }
    got: dict[str, grpc.StatusCode] = {}
    served = 0
    flooding = threading.Event()
    flooding.set()

    errors: list[grpc.RpcError] = []

    def well_formed_caller() -> None:
        nonlocal served
        with grpc.insecure_channel(plugin_target(kubelet_ns)) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            while flooding.is_set():
                try:
                    stub.Allocate(allocate_request("kvm-7"), timeout=30)
                except grpc.RpcError as exc:
                    errors.append(exc)
                    return
                served += 1

    caller = threading.Thread(target=well_formed_caller)
    caller.start()
    try:
        with grpc.insecure_channel(plugin_target(kubelet_ns)) as channel:
            for _ in range(3):  # each kind more than once, so that the caller overlaps them
                for name, (method, payload) in cases.items():
                    begin = time.monotonic()
                    got[name] = _unary(channel, method, payload)
                    print(f"{name}: {got[name].name} in {(time.monotonic() - begin) * 1000:.0f} ms")
        wait_until(lambda: served >= 1, 30, "the well-formed caller answered")
    finally:
        flooding.clear()
        caller.join(60)
    assert not caller.is_alive()
    assert errors == []
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert got == {name: invalid if "2,000" in name else exhausted for name in cases}
    assert d.proc is not None
    assert d.proc.poll() is None
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices


def test_a_4_mib_allocate_is_refused_before_it_costs_memory(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """Valid-looking unit IDs up to the 4 MiB gRPC allows: the kubelet never sends more than
    the units' IDs, so the server refuses it (RESOURCE_EXHAUSTED) unread."""
    d = daemon()
    full(kubelet)
    assert d.proc is not None
    ids = [f"kvm-{n % UNITS}" for n in range(430_000)]
    payload = allocate_request(*ids).SerializeToString()
    assert 4_000_000 < len(payload) < 4 * 1024 * 1024
    before = Footprint.of(d.proc.pid)
    Footprint.reset_peak(d.proc.pid)
    with grpc.insecure_channel(plugin_target(kubelet_ns)) as channel:
        codes = [_unary(channel, "Allocate", payload) for _ in range(3)]
        assert _unary(channel, "Allocate", allocate_request("kvm-0").SerializeToString()) == grpc.StatusCode.OK
    growth = (Footprint.of(d.proc.pid).peak_rss_kib - before.rss_kib) / 1024
    print(f"4 MiB Allocate of unit IDs ({len(payload) / 1e6:.1f} MB): {codes[0].name}, peak RSS +{growth:.1f} MiB")
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
    assert growth < 8, growth
    assert kubelet.allocate("pod-a", "vm", {KVM: 1}).devices == [KVM_SPEC]


# --- SIGTERM at awkward moments -------------------------------------------------------


def test_sigterm_during_registration(kubelet_ns: Namespace, daemon: MakeDaemon) -> None:
    """SIGTERM while Register hangs on a silent kubelet: exit 0 in time, our socket
    removed, and the Register span (cut short) reaches the collector."""
    with OtlpReceiver() as otlp, SilentPeer(kubelet_ns.path(KUBELET_SOCKET), mode="hang") as peer:
        d = daemon(env=otlp_env(otlp))
        wait_until(lambda: peer.accepted >= 1, 10, "Register in flight")
        wait_until(lambda: SOCKET in kubelet_ns.sockets(), 10, "our socket")
        begin = time.monotonic()
        assert d.stop() == 0
        took = time.monotonic() - begin
        assert took < 5.0
        assert SOCKET not in kubelet_ns.sockets()
        spans = otlp.wait_for(lambda s: s.name == "v1beta1.Registration/Register", timeout=5)
        print(f"SIGTERM during Register: exit 0 in {took:.2f}s, Register span received")
    assert spans[0].attributes["ate_devplugin.resource_name"] == KVM
    assert spans[0].end_ns > spans[0].start_ns


def test_sigterm_during_a_burst_of_allocate_calls(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    """SIGTERM while 16 callers keep calling Allocate: exit 0 in time, sockets removed,
    and every Allocate that was answered has its span at the collector."""
    with OtlpReceiver() as otlp:
        d = daemon(env=otlp_env(otlp))
        full(kubelet)
        answered = 0
        stop = threading.Event()
        lock = threading.Lock()

        def burst() -> None:
            nonlocal answered

            async def caller(n: int) -> None:
                nonlocal answered
                async with grpc.aio.insecure_channel(plugin_target(kubelet_ns)) as channel:
                    stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                    i = 0
                    while not stop.is_set():
                        try:
                            await stub.Allocate(allocate_request(f"kvm-{(n * 1000 + i) % UNITS}"), timeout=10)
                        except grpc.aio.AioRpcError:
                            return  # the daemon went away
                        with lock:
                            answered += 1
                        i += 1

            async def main() -> None:
                await asyncio.gather(*(caller(n) for n in range(16)))

            asyncio.run(main())

        thread = threading.Thread(target=burst, name="allocate burst")
        thread.start()
        try:
            wait_until(lambda: answered >= soak(200, 2000), 60, "a burst under way")
            begin = time.monotonic()
            assert d.stop() == 0
            took = time.monotonic() - begin
        finally:
            stop.set()
            thread.join(30)
        assert took < 5.0
        assert SOCKET not in kubelet_ns.sockets()
        with lock:
            done = answered
        spans = otlp.wait_for(lambda s: s.name == "v1beta1.DevicePlugin/Allocate", count=done, timeout=10)
        ok = [s for s in spans if s.attributes.get("rpc.grpc.status_code") == 0]
        assert len(ok) >= done
        print(f"SIGTERM during a burst: exit 0 in {took:.2f}s, {done} answered, {len(ok)} OK spans")
    assert log_matches(d.log_lines(), "stopped")
