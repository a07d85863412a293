"""A real Prometheus scrapes the daemon through kubelet bench scenarios; read back by PromQL."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.kubelet import KubeletBench
from tests.harness.monitoring import PREFERRED_CONFIG
from tests.harness.prometheus import INSTALL, Prometheus, PrometheusConfig, Sample, ScrapeTarget
from tests.harness.require import require_tool

KVM = "ate.dev/kvm"
SEL = f'resource_name="{KVM}",node="node-1"'


@pytest.fixture
def scraped(daemon: MakeDaemon, tmp_path: Path) -> Iterator[tuple[DevicePluginDaemon, Prometheus]]:
    require_tool("prometheus", INSTALL)
    d = daemon(PREFERRED_CONFIG)
    config = PrometheusConfig(targets=[ScrapeTarget(f"127.0.0.1:{d.port}", node="node-1")])
    with Prometheus(config) as prom:
        prom.wait_for_targets_up()
        yield d, prom


def value_is(expected: float) -> Callable[[list[Sample]], bool]:
    return lambda samples: len(samples) == 1 and samples[0].value == expected


def test_prometheus_sees_the_daemons_life(
    kubelet: KubeletBench, scraped: tuple[DevicePluginDaemon, Prometheus], device_root: Path
) -> None:
    _, prom = scraped
    kubelet.wait(KVM, allocatable=4096, timeout=30)
    prom.wait_for(f"ate_devplugin_registered{{{SEL}}}", value_is(1))
    prom.wait_for(f'ate_devplugin_devices{{{SEL},health="healthy"}}', value_is(4096))
    prom.wait_for(f"ate_devplugin_device_nodes_present{{{SEL}}}", value_is(1))
    prom.wait_for(f"ate_devplugin_list_and_watch_streams{{{SEL}}}", value_is(1))

    for n in range(3):
        kubelet.allocate(f"pod-{n}", "vm", {KVM: 1})
    prom.wait_for(f'ate_devplugin_allocate_requests_total{{{SEL},code="OK"}}', value_is(3))
    prom.wait_for(f"ate_devplugin_allocate_duration_seconds_count{{{SEL}}}", value_is(3))
    prom.wait_for(f"ate_devplugin_preferred_allocation_requests_total{{{SEL}}}", value_is(3))
    p99 = f"histogram_quantile(0.99, sum by (le) (rate(ate_devplugin_allocate_duration_seconds_bucket{{{SEL}}}[1m])))"
    prom.wait_for(p99, lambda s: len(s) == 1 and 0 < s[0].value <= 1)

    kubelet.restart()
    kubelet.wait(KVM, allocatable=4096, timeout=30)
    prom.wait_for('ate_devplugin_kubelet_restarts_total{node="node-1"}', value_is(1))
    prom.wait_for(f'ate_devplugin_registrations_total{{{SEL},result="success"}}', value_is(2))
    prom.wait_for(f"ate_devplugin_registered{{{SEL}}}", value_is(1))

    remove_device_node(device_root, "kvm")
    kubelet.wait(KVM, allocatable=0, timeout=30)
    prom.wait_for(f'ate_devplugin_devices{{{SEL},health="unhealthy"}}', value_is(4096))
    prom.wait_for(f'ate_devplugin_devices{{{SEL},health="healthy"}}', value_is(0))
    prom.wait_for(f"ate_devplugin_device_nodes_present{{{SEL}}}", value_is(0))
    prom.wait_for(f'ate_devplugin_device_health_changes_total{{{SEL},health="unhealthy"}}', value_is(1))
    add_device_node(device_root, "kvm", "/dev/kvm")
    prom.wait_for(f'ate_devplugin_devices{{{SEL},health="healthy"}}', value_is(4096))

    # Every labelled series of the contract, present from the start; build and process info too.
    for name in (
        "ate_devplugin_build_info",
        "process_resident_memory_bytes",
        "python_gc_collections_total",
        f'ate_devplugin_allocate_requests_total{{{SEL},code="INVALID_ARGUMENT"}}',
        f'ate_devplugin_registrations_total{{{SEL},result="timeout"}}',
        'ate_devplugin_config_reloads_total{result="failure"}',
        f"ate_devplugin_list_and_watch_updates_total{{{SEL}}}",
    ):
        assert prom.query(name), name


def test_promtool_finds_nothing_to_lint(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    promtool = require_tool("promtool", INSTALL)
    d = daemon()
    kubelet.wait(KVM, allocatable=4096, timeout=30)
    kubelet.allocate("pod-a", "vm", {KVM: 1})
    body = d.get("/metrics")[1]
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == b"", result.stdout  # no lint findings at all
