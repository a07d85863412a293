"""PodResources answers a node never gives, from a peer at the kubelet's PodResources
socket, to the real daemon beside the kubelet's device manager: huge, with names past
every Kubernetes limit, undecodable. The daemon keeps its memory, its /metrics small and
its Allocate answers flowing; each failure is counted once, without a traceback.

The Allocate latency during the huge answers is printed (a figure, not an assertion).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from ate_devplugin.api.podresources.v1 import api_pb2 as prpb
from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.faults import Footprint, PodResourcesPeer
from tests.harness.kubelet import KubeletBench, Namespace
from tests.reliability.test_hostile_peers import KVM, allocate_request, full, plugin_target

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIMIT = 4 * 1024 * 1024  # what the daemon receives at most


def holder(namespace: str, name: str, container: str = "vmm", units: int = 1) -> prpb.PodResources:
    devices = prpb.ContainerDevices(resource_name=KVM, device_ids=[f"kvm-{i}" for i in range(units)])
    return prpb.PodResources(
        namespace=namespace, name=name, containers=[prpb.ContainerResources(name=container, devices=[devices])]
    )


def answer(pods: list[prpb.PodResources]) -> bytes:
    return prpb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()


def many_pods(count: int = 80_000) -> bytes:
    """Pods with one container each, every thousandth holding a unit: under 4 MiB."""
    pods = [prpb.PodResources(namespace="production", name=f"microvm-worker-{n:06d}",
                              containers=[prpb.ContainerResources(name="worker")]) for n in range(count)]  # fmt: skip
    for n in range(0, count, 1000):
        pods[n] = holder("production", f"microvm-worker-{n:06d}", "worker")
    data = answer(pods)
    assert len(data) < LIMIT
    return data


def empty_entries() -> bytes:
    """As many (empty) pods as fit: the most entries an answer under the limit can hold."""
    return b"\x0a\x00" * ((LIMIT - 1024) // 2)


def long_names(pods: int = 30, length: int = 60_000) -> bytes:
    return answer([holder("vm", f"{n}-" + "p" * length, "c" * length) for n in range(pods)])


UNDECODABLE = b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 64  # a length past the end of the answer


@pytest.fixture
def pods_peer(kubelet_ns: Namespace) -> Iterator[PodResourcesPeer]:
    with PodResourcesPeer(kubelet_ns.path(POD_RESOURCES_SOCKET), answer([holder("vm", "a")])) as peer:
        yield peer


def pods_daemon(
    daemon: MakeDaemon, kubelet: KubeletBench, peer: PodResourcesPeer, measured: bool = True
) -> DevicePluginDaemon:
    """``measured=False``: the daemon runs without the suite's subprocess coverage, whose
    tracing makes reading a 4 MiB answer outlast the 5 s read deadline."""
    env: dict[str, str | None] = {"ATE_DEVPLUGIN_POD_RESOURCES": "on", "ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "0.3"}
    if not measured:
        env["COVERAGE_PROCESS_CONFIG"] = None
    d = daemon(env=env)
    full(kubelet)
    wait_for(lambda: listed(d, "success") >= 1, "the first List")
    return d


def listed(d: DevicePluginDaemon, result: str) -> float:
    return d.metric("ate_devplugin_pod_resources_requests_total", result=result)


def wait_for(check: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@contextmanager
def allocating(ns: Namespace) -> Iterator[list[float]]:
    """Allocate calls one after the other meanwhile; yields their latencies (seconds)."""
    latencies: list[float] = []
    stop = threading.Event()

    def call() -> None:
        with grpc.insecure_channel(plugin_target(ns)) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            while not stop.is_set():
                begin = time.perf_counter()
                stub.Allocate(allocate_request("kvm-0"), timeout=30)
                latencies.append(time.perf_counter() - begin)

    thread = threading.Thread(target=call, name="allocate meanwhile")
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join(60)


def answered_with(d: DevicePluginDaemon, peer: PodResourcesPeer, data: bytes, lists: int = 3) -> None:
    """Sets the peer's answer and waits until the daemon has read it ``lists`` times."""
    peer.answer = data
    calls = peer.calls
    wait_for(lambda: peer.calls >= calls + lists + 1, f"{lists} Lists of the new answer")


@pytest.mark.parametrize("kind", ["80,000 pods", "4 MiB of empty entries"])
def test_a_huge_answer_costs_little_memory_and_allocate_goes_on(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, pods_peer: PodResourcesPeer, kind: str
) -> None:
    d = pods_daemon(daemon, kubelet, pods_peer, measured=False)  # RSS and latency as in production
    assert d.proc is not None
    data = many_pods() if kind == "80,000 pods" else empty_entries()
    before = Footprint.of(d.proc.pid)
    Footprint.reset_peak(d.proc.pid)
    with allocating(kubelet_ns) as latencies:
        answered_with(d, pods_peer, data)
    after = Footprint.of(d.proc.pid)
    growth = (after.peak_rss_kib - before.rss_kib) / 1024
    print(
        f"PodResources answer of {kind} ({len(data) / 1e6:.1f} MB): RSS {before.rss_kib / 1024:.0f} MiB, "
        f"peak +{growth:.1f} MiB; {len(latencies)} Allocate calls meanwhile, slowest "
        f"{max(latencies) * 1000:.0f} ms"
    )
    assert latencies, "no Allocate answered while the answers were read"
    assert growth < 24, growth
    assert d.ready()
    holders = 80 if kind == "80,000 pods" else 0
    assert d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == holders
    assert listed(d, "error") == 0


def test_names_past_the_kubernetes_limits_are_cut_and_counted(
    kubelet: KubeletBench, daemon: MakeDaemon, pods_peer: PodResourcesPeer
) -> None:
    d = pods_daemon(daemon, kubelet, pods_peer)
    answered_with(d, pods_peer, long_names(), lists=1)
    metrics = d.get("/metrics")[1]
    series = {labels: v for (name, labels), v in d.metrics().items() if name == "ate_devplugin_pod_units"}
    print(f"30 pods of 60,000-character names: /metrics {len(metrics) / 1e3:.0f} kB")
    assert len(series) == 30
    for labels in series:
        values = dict(labels)
        assert (len(values["pod"]), len(values["container"])) == (253, 63), values
    assert d.metric("ate_devplugin_pod_units_labels_truncated") == 30
    assert len(metrics) < 200_000


def test_an_undecodable_answer_is_one_error_and_no_traceback(
    kubelet: KubeletBench, daemon: MakeDaemon, pods_peer: PodResourcesPeer
) -> None:
    d = pods_daemon(daemon, kubelet, pods_peer)
    success = listed(d, "success")
    pods_peer.answer = UNDECODABLE
    calls = pods_peer.calls
    wait_for(lambda: listed(d, "error") >= 1, "the error counted")
    wait_for(lambda: pods_peer.calls >= calls + 3, "more Lists")
    errors = listed(d, "error")
    assert listed(d, "success") == success  # never counted as both
    assert errors >= pods_peer.calls - calls - 1, (errors, pods_peer.calls - calls)
    assert [line for line in d.log_lines() if "exc" in line or "Traceback" in str(line)] == []
    warnings = [line for line in d.log_lines() if "cannot list pod resources" in str(line.get("msg"))]
    assert len(warnings) == 1, warnings  # the same failure told once
    assert d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == 1  # the last good answer's
    pods_peer.answer = answer([holder("vm", "a"), holder("vm", "b")])
    wait_for(lambda: d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == 2, "a good answer read")


def test_an_answer_over_the_limit_is_refused(
    kubelet: KubeletBench, daemon: MakeDaemon, pods_peer: PodResourcesPeer, tmp_path: Path
) -> None:
    d = pods_daemon(daemon, kubelet, pods_peer)
    pods_peer.answer = b"\x0a\x00" * (LIMIT // 2 + 1024)
    wait_for(lambda: listed(d, "error") >= 1, "the error counted")
    assert d.ready()
