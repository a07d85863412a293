"""The memory budget, per mode, against the chart's 128 Mi limit: the real daemon beside the
kubelet's device manager is fed the worst input of each kind a client can send it, one
after the other, and its peak resident size (VmHWM) stays under the budget.

The inputs: PodResources answers (4 MiB of empty entries, 80,000 pods, 60,000-character
names, undecodable bytes), the CDI directory removed again and again, 4 MiB Allocate
requests of unit IDs, torn writes of the config file. In modes dra and both the API
server is unreachable (a closed loopback port): the DRA driver retries with backoff, and
its own inputs (claims, slices) are tests/e2e's and the DRA tests'; what it loads (the
Kubernetes client) is in the figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.harness.daemon import DevicePluginDaemon
from tests.harness.faults import Footprint, PodResourcesPeer, SpawnDaemon, remove_tree
from tests.harness.kubelet import KubeletBench, Namespace
from tests.harness.wait import wait_until
from tests.reliability.test_hostile_peers import KVM, _unary, allocate_request, full, plugin_target
from tests.reliability.test_pod_resources_answers import (
    POD_RESOURCES_SOCKET,
    UNDECODABLE,
    answer,
    answered_with,
    empty_entries,
    holder,
    long_names,
    many_pods,
)

# Peak resident MiB, each within the chart's 128 Mi limit with a quarter of it to spare.
BUDGET_MIB = {"device-plugin": 80, "dra": 96, "both": 96}
CDI_DIR = "/var/lib/cdi"
CONFIG = "resources:\n  - {name: ate.dev/kvm, devices: [/dev/kvm], allocate: cdi}\n"
TORN = "resources:\n  - {name: ate.dev/kvm, devices: [/dev/k"
UNREACHABLE = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
    "users": [{"name": "u", "user": {"token": "none"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


# The daemon's memory does not depend on the kubelet's release (the peaks on 1.29, 1.35 and
# 1.37 were within 3 MiB of each other): one release keeps the suite's time.
@pytest.mark.parametrize("kubelet_version", ["1.37"], indirect=True)
@pytest.mark.parametrize("mode", list(BUDGET_MIB))
def test_the_worst_inputs_keep_memory_under_the_budget(
    kubelet: KubeletBench,
    kubelet_ns: Namespace,
    spawn_daemon: SpawnDaemon,
    device_root: Path,
    tmp_path: Path,
    mode: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(UNREACHABLE))
    env = {
        "ATE_DEVPLUGIN_MODE": mode,
        "ATE_DEVPLUGIN_NODE_NAME": "node-a",
        "ATE_DEVPLUGIN_CDI_DIR": CDI_DIR,
        "ATE_DEVPLUGIN_POD_RESOURCES": "on",
        "ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "0.3",
        "KUBECONFIG": str(kubeconfig),
        # The daemon's memory, not coverage's: `make test` measures the daemons it starts
        # (coverage's subprocess patch), whose tracer data added 4-7 MiB to these peaks.
        "COVERAGE_PROCESS_CONFIG": None,
        "COVERAGE_PROCESS_START": None,
    }
    with PodResourcesPeer(kubelet_ns.path(POD_RESOURCES_SOCKET), answer([holder("vm", "a")])) as peer:
        d: DevicePluginDaemon = spawn_daemon(device_root, ns=kubelet_ns, config=CONFIG, env=env)
        assert d.proc is not None
        pid = d.proc.pid
        if mode != "dra":
            full(kubelet)
        spec = kubelet_ns.path(f"{CDI_DIR}/ate.dev-kvm.json")
        wait_until(spec.exists, 10, "the CDI spec")
        idle = Footprint.of(pid).rss_kib / 1024
        peaks: dict[str, float] = {}

        def measured(kind: str) -> None:
            peaks[kind] = Footprint.of(pid).peak_rss_kib / 1024
            Footprint.reset_peak(pid)

        Footprint.reset_peak(pid)
        for name, data in [
            ("PodResources: 4 MiB of empty entries", empty_entries()),
            ("PodResources: 80,000 pods", many_pods()),
            ("PodResources: 60,000-character names", long_names()),
            ("PodResources: undecodable", UNDECODABLE),
        ]:
            answered_with(d, peer, data)
            measured(name)
        for _ in range(20):
            remove_tree(kubelet_ns.path(CDI_DIR))
            wait_until(spec.exists, 10, "the CDI spec back")
        measured("CDI directory removed 20 times")
        if mode != "dra":
            payload = allocate_request(*[f"kvm-{n % 4096}" for n in range(430_000)]).SerializeToString()
            with grpc.insecure_channel(plugin_target(kubelet_ns)) as channel:
                codes = {_unary(channel, "Allocate", payload) for _ in range(5)}
            assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            measured("Allocate of 4 MiB, 5 times")
        assert d.config_path is not None
        for _ in range(5):
            d.config_path.write_text(TORN)
            d.config_path.write_text(CONFIG)
        wait_until(lambda: d.metric("ate_devplugin_config_rejected") == 0, 10, "the config settled")
        measured("config file torn 5 times")
        assert d.running()
        assert d.metric("ate_devplugin_config_reloads_total", result="success") == 0
        if mode != "dra":
            assert kubelet.allocate("pod-a", "vm", {KVM: 1}).cdi_devices == ["ate.dev/kvm=kvm"]
    worst = max(peaks, key=lambda k: peaks[k])
    print(f"{mode}: idle {idle:.1f} MiB; peaks: " + "; ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    assert peaks[worst] < BUDGET_MIB[mode], f"{worst}: {peaks[worst]:.1f} MiB"
