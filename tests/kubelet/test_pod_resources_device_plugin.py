"""Which pods hold units of the device plugin, read from the kubelet's own PodResources server.

The kubelet bench with ``--pod-resources-socket`` serves the kubelet's PodResources v1
server over its device manager's allocations and its active pods; our daemon, with its
defaults (``--pod-resources on``), hears the device manager's checkpoint rewrites itself and
lists: admitted pods show in its metrics, a burst of admissions costs a few Lists, not one
each, and an ended pod (no rewrite) goes with the fallback List.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.kubelet import KubeletBench, Namespace
from tests.harness.require import require_kubelet_bench
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
UNITS = 4096
NAMESPACE = "vms"


@pytest.fixture(params=["1.35", "1.37"], ids=["k8s1.35", "k8s1.37"])
def kubelet_version(request: pytest.FixtureRequest) -> str:
    """The bench serves PodResources from 1.35 (1.29's server takes other providers)."""
    require_kubelet_bench(request.param)
    return str(request.param)


@pytest.fixture
def kubelet(kubelet_ns: Namespace, kubelet_version: str, tmp_path: Path) -> Iterator[KubeletBench]:
    bench = KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs", pod_resources=True)
    try:
        bench.start()
        yield bench
    finally:
        bench.close()


def units(d: DevicePluginDaemon, pod: str) -> float | None:
    labels = {"resource_name": KVM, "namespace": NAMESPACE, "pod": pod, "container": "vmm"}
    return d.metrics().get(("ate_devplugin_pod_units", tuple(sorted(labels.items()))))


def lists(d: DevicePluginDaemon) -> float:
    return d.metric("ate_devplugin_pod_resources_requests_total", result="success")


def admit(kubelet: KubeletBench, pod: str, count: int = 1) -> None:
    kubelet.allocate(f"uid-{pod}", "vmm", {KVM: count}, pod_name=pod, namespace=NAMESPACE)


def test_admitted_pods_show_and_a_burst_costs_a_few_lists(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon()
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    admit(kubelet, "worker-a", 2)
    wait_until(lambda: units(d, "worker-a") == 2, 10, "worker-a's units in /metrics")
    before = lists(d)
    for i in range(30):
        admit(kubelet, f"burst-{i}")
    wait_until(lambda: units(d, "burst-29") == 1, 15, "the burst's last pod in /metrics")
    assert all(units(d, f"burst-{i}") == 1 for i in range(30))
    assert d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == 31
    # Thirty rewrites of the checkpoint, coalesced: a List at once, then at most one per gap.
    assert lists(d) - before < 10


def test_an_ended_pod_goes_with_the_fallback_list(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon(env={"ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "1"})
    kubelet.wait(KVM, capacity=UNITS, allocatable=UNITS, timeout=30)
    admit(kubelet, "worker-a")
    admit(kubelet, "worker-b")
    wait_until(lambda: units(d, "worker-b") == 1, 10, "worker-b in /metrics")
    kubelet.remove_pod("uid-worker-a")  # its units freed: the kubelet writes no checkpoint
    wait_until(lambda: units(d, "worker-a") is None, 10, "worker-a gone with the fallback List")
    assert units(d, "worker-b") == 1
