"""Which pods hold the device, on a real one-node cluster: the kubelet's own PodResources
API, read by the plugin through the chart's read-only mount, scraped by a real Prometheus
through the chart's ServiceMonitor, with the chart's alert rules loaded.

A consumer pod that keeps running appears in ``ate_devplugin_pod_units`` with its
namespace, pod and container; the device node removed, ``ate_devplugin_pods_on_unhealthy_device``
counts it, the plugin logs the loss naming it and AteDevpluginPodsOnUnhealthyDevice fires;
the pod deleted, its series goes. Every dashboard query that reads these series is run
against the Prometheus while the pod holds the device (the bench-driven dashboard tests
cannot: the kubelet bench serves no PodResources).

The tests run in file order and share one release, installed by the module fixture and
removed at its end, so the modules after this one find the cluster as they expect.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import NODE, Cluster, wait_until
from tests.e2e.monitoring import SandboxPrometheus, dashboard_queries, dashboard_values, fill, scraping
from tests.e2e.userpath import (
    NAMESPACE,
    RESOURCE,
    WORKLOADS,
    Helm,
    ensure_workload_namespace,
    example_pod,
    metrics,
    plugin_pods,
    sample,
    wait_plugin_ready,
)
from tests.harness.monitoring import ALERTS_FILE, reads_pod_resources

REPO = Path(__file__).resolve().parents[2]
PRIVATE_DEV = "/run/ate-e2e-pods-dev"  # in the node's tmpfs: the host's /dev is never touched
KVM = f"{PRIVATE_DEV}/kvm"
INTERVAL_S = 15  # podResources.interval: how long a deleted pod's series may stay
ALERT = "AteDevpluginPodsOnUnhealthyDevice"


@pytest.fixture(scope="module")
def release(cluster: Cluster, helm: Helm) -> Iterator[None]:
    """The chart with PodResources on, watching a device directory of the node's own, so
    the device node can be removed; uninstalled at the end."""
    cluster.node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0666 {KVM} c 10 232"])
    try:
        helm.install(
            "--set", f"hostPaths.dev={PRIVATE_DEV}", "--set", "podResources.enabled=true",
            "--set", f"podResources.interval={INTERVAL_S}",
        )  # fmt: skip
        yield
    finally:
        if helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            helm.uninstall()
        wait_until("the plugin pod gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        cluster.node.run(["rm", "-rf", PRIVATE_DEV])


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, release: None, helm: Helm) -> Iterator[SandboxPrometheus]:
    with scraping(cluster, str(helm.path), rule_files=[ALERTS_FILE]) as prom:
        yield prom


@pytest.fixture(scope="module")
def holder(cluster: Cluster, release: None) -> Iterator[dict[str, str]]:
    """The device-only example as shipped (non-root, one unit of ate.dev/kvm), kept running;
    deleted by the last test (or at the end)."""
    pod: dict[str, Any] = copy.deepcopy(example_pod("kvm-holder"))
    pod["metadata"]["name"] += "-" + uuid.uuid4().hex[:6]
    container = pod["spec"]["containers"][0]
    container["command"] = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"]
    ensure_workload_namespace(cluster)
    wait_plugin_ready(cluster)
    cluster.node.wait_resource(RESOURCE, "4096")
    cluster.apply(pod)
    name = pod["metadata"]["name"]
    try:
        wait_until(
            f"pod {name} running",
            lambda: cluster.get_json("pod", "-n", WORKLOADS, name)["status"].get("phase") == "Running",
            180,
        )
        yield {"namespace": WORKLOADS, "pod": name, "container": container["name"]}
    finally:
        cluster.kubectl("delete", "pod", "-n", WORKLOADS, name, "--wait=false", check=False)


def plugin_metrics(cluster: Cluster) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    (pod,) = plugin_pods(cluster)
    return metrics(cluster, pod)


def units_of(cluster: Cluster, holder: dict[str, str]) -> float | None:
    return sample(plugin_metrics(cluster), "ate_devplugin_pod_units", resource_name=RESOURCE, **holder)


def selector(holder: dict[str, str]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in holder.items())


def panel_results(prometheus: SandboxPrometheus) -> dict[str, list[Any]]:
    """Each dashboard query that reads the pod series, run now: {where: samples}."""
    values = dashboard_values(prometheus.cluster.node)
    found = {}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for where, expr, _ in dashboard_queries(json.loads(path.read_text())):
            if reads_pod_resources(expr):
                found[f"{path.stem} {where}: {fill(expr, values)}"] = prometheus.query(fill(expr, values))
    return found


def test_a_pod_holding_the_device_is_listed_with_its_namespace_pod_and_container(
    cluster: Cluster, prometheus: SandboxPrometheus, holder: dict[str, str]
) -> None:
    wait_until("the holder in the plugin's metrics", lambda: units_of(cluster, holder) == 1, 120)
    values = plugin_metrics(cluster)
    assert sample(values, "ate_devplugin_pods_holding_units", resource_name=RESOURCE) == 1
    assert sample(values, "ate_devplugin_pods_on_unhealthy_device", resource_name=RESOURCE) == 0
    assert sample(values, "ate_devplugin_pod_resources_requests_total", result="success")
    assert sample(values, "ate_devplugin_pod_units_series_dropped") == 0
    # Through the ServiceMonitor: the consumer's labels, not the plugin pod's.
    (series,) = prometheus.wait_for(f"ate_devplugin_pod_units{{{selector(holder)}}} == 1", timeout=120)
    assert series.labels["node"] == NODE
    assert series.labels["job"] == "ate-devplugin"
    print(f"series: {series.labels} = {series.value}")


def test_the_pod_panels_return_data(prometheus: SandboxPrometheus, holder: dict[str, str]) -> None:
    prometheus.wait_for(f"ate_devplugin_pod_units{{{selector(holder)}}} == 1", timeout=120)
    prometheus.wait_for('ate_devplugin_pods_holding_units{resource_name="ate.dev/kvm"} == 1', timeout=120)
    # increase() over the rate interval needs two scrapes of the series first.
    wait_until(
        "every pod panel query with data",
        lambda: all(panel_results(prometheus).values()),
        120,
    )
    results = panel_results(prometheus)
    assert len(results) >= 5
    for where, samples in results.items():
        print(f"{where}\n    -> {[(s.labels, s.value) for s in samples]}")
    empty = [where for where, samples in results.items() if not samples]
    assert not empty, "queries without data:\n" + "\n".join(empty)
    (row,) = next(v for k, v in results.items() if "'Pods holding $resource'" in k)
    assert {k: row.labels[k] for k in holder} == holder
    assert row.value == 1


def test_a_lost_device_counts_the_pod_names_it_and_fires_the_alert(
    cluster: Cluster, prometheus: SandboxPrometheus, holder: dict[str, str]
) -> None:
    wait_until("the holder in the plugin's metrics", lambda: units_of(cluster, holder) == 1, 120)
    cluster.node.run(["rm", KVM])
    try:
        cluster.node.wait_resource(RESOURCE, "0")
        wait_until(
            "the holder counted on a lost device",
            lambda: (
                sample(plugin_metrics(cluster), "ate_devplugin_pods_on_unhealthy_device", resource_name=RESOURCE) == 1
            ),
            120,
        )
        (plugin,) = plugin_pods(cluster)
        logs = cluster.kubectl("logs", "-n", NAMESPACE, plugin["metadata"]["name"])
        lost = [json.loads(line) for line in logs.splitlines() if '"device lost' in line]
        assert lost, logs[-3000:]
        assert lost[-1]["pods"] == [f"{holder['namespace']}/{holder['pod']}"], lost
        assert lost[-1]["resource"] == RESOURCE
        print(f"log line: {lost[-1]}")

        prometheus.wait_for('ate_devplugin_pods_on_unhealthy_device{resource_name="ate.dev/kvm"} == 1', timeout=120)
        start = time.monotonic()

        def firing() -> dict[str, Any] | None:
            return next(
                (a for a in prometheus.alerts() if a["labels"]["alertname"] == ALERT and a["state"] == "firing"), None
            )

        alert = wait_until(f"{ALERT} firing", firing, 300)
        print(f"{ALERT} firing {time.monotonic() - start:.0f}s after Prometheus saw the count: {alert}")
        assert alert["labels"]["node"] == NODE
        assert alert["labels"]["resource_name"] == RESOURCE
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["description"].startswith(f"1 pod(s) on node {NODE} hold units of")
        (series,) = next(v for k, v in panel_results(prometheus).items() if "'Pods on nodes whose device is gone'" in k)
        assert series.value == 1, "the fleet panel's query counts the pod"
        print(f"fleet panel 'Pods on nodes whose device is gone': {series.labels} = {series.value}")
    finally:
        cluster.node.run(["mknod", "-m", "0666", KVM, "c", "10", "232"])
    cluster.node.wait_resource(RESOURCE, "4096")
    wait_until(
        "no pod counted on a lost device",
        lambda: sample(plugin_metrics(cluster), "ate_devplugin_pods_on_unhealthy_device", resource_name=RESOURCE) == 0,
        120,
    )


def test_a_deleted_pod_leaves_the_series(cluster: Cluster, holder: dict[str, str]) -> None:
    wait_until("the holder in the plugin's metrics", lambda: units_of(cluster, holder) == 1, 120)
    cluster.kubectl("delete", "pod", "-n", holder["namespace"], holder["pod"], "--wait=true", timeout=180)
    start = time.monotonic()
    wait_until("the holder's series gone", lambda: units_of(cluster, holder) is None, 4 * INTERVAL_S + 60)
    values = plugin_metrics(cluster)
    assert sample(values, "ate_devplugin_pods_holding_units", resource_name=RESOURCE) == 0
    print(f"series gone {time.monotonic() - start:.0f}s after the pod was deleted (interval {INTERVAL_S}s)")
