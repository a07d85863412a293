"""DRA on a real node: the one-node cluster on containerd 2 (CDI) and cgroup v2, the chart
with ``dra.mode=dra`` and /dev/kvm and /dev/net/tun as resources, and the micro-VM worker
(docs/examples/microvm-worker-pod.yaml) getting both through one ResourceClaimTemplate
with a request for each of the chart's DeviceClasses: its init container takes the tun
request, QEMU the claim. The daemon registers through the kubelet's plugin registry,
publishes the node's slots as ResourceSlices, and answers NodePrepareResources with the
resource's CDI device, whose spec gives the node mode 0666 in the container. A real
Prometheus scrapes the daemon through the chart's ServiceMonitor, and every dashboard query
on the DRA series is run against it while two pods hold claims.

The tests run in file order and share one release, removed by the uninstall test.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import CDI_SPEC_DIR, NODE, Cluster, ClusterError, wait_until
from tests.e2e.monitoring import SandboxPrometheus, dashboard_queries, dashboard_values, fill, scraping
from tests.e2e.userpath import (
    CLAIM_TEMPLATE,
    MICROVM_WORKERS,
    NAMESPACE,
    RELEASE,
    RESOURCE,
    TEST_SELECTOR,
    TUN,
    Helm,
    attributes,
    booted_as_shipped,
    claiming,
    ensure_workload_namespace,
    helm_test_passed,
    kvm_probed,
    make_helm,
    metrics,
    plugin_pods,
    run_pod,
    sample,
    wait_plugin_ready,
    worker,
)
from tests.e2e.vmm import QemuRun
from tests.harness.monitoring import reads_dra

REPO = Path(__file__).resolve().parents[2]

DRIVER = "ate.dev"
DEVICE_CLASS = "kvm.ate.dev"
SLOTS = 4
ALL_SLOTS = sorted(f"ate-dev-{r}-{i}" for r in ("kvm", "tun") for i in range(SLOTS))
SPEC_FILE = f"{CDI_SPEC_DIR}/ate.dev-kvm.json"
REGISTRATION_SOCKET = f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"
DRA_SOCKET = f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
RESOURCES = [
    {"name": RESOURCE, "devices": ["/dev/kvm"], "cdi": {"file_mode": "0666"}},
    {"name": TUN, "devices": ["/dev/net/tun"], "units": 1024, "cdi": {"file_mode": "0666"}},
]


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER]


def slice_devices(cluster: Cluster) -> list[str]:
    return sorted(d["name"] for s in slices(cluster) for d in s["spec"].get("devices", []))


def probed_slots(cluster: Cluster) -> list[str] | None:
    """The node's device names once they are the slots and every KVM slot carries the probe's attributes."""
    devices = [d for s in slices(cluster) for d in s["spec"].get("devices", [])]
    names = sorted(d["name"] for d in devices)
    kvm = [d for d in devices if d["name"].startswith("ate-dev-kvm-")]
    return names if names == ALL_SLOTS and all(kvm_probed(d) for d in kvm) else None


def exists_on_node(cluster: Cluster, path: str) -> bool:
    return cluster.node.run(["test", "-e", path], check=False).returncode == 0


def plugin_metrics(cluster: Cluster) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return metrics(cluster, wait_plugin_ready(cluster))


@pytest.fixture(scope="module")
def installed(cluster_containerd2: Cluster, helm_containerd2: Helm) -> Iterator[None]:
    helm_containerd2.install(
        "--set", "dra.mode=dra", "--set", f"dra.slots={SLOTS}",
        "--set-json", f"deviceConfig.resources={json.dumps(RESOURCES)}",
    )  # fmt: skip
    ensure_workload_namespace(cluster_containerd2)
    cluster_containerd2.apply(CLAIM_TEMPLATE)
    try:
        yield
    finally:
        if helm_containerd2.run("status", RELEASE, "-n", NAMESPACE, check=False).returncode == 0:
            helm_containerd2.uninstall()


@pytest.fixture(scope="module")
def prometheus(cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None) -> Iterator[SandboxPrometheus]:
    with scraping(cluster_containerd2, str(helm_containerd2.path)) as prom:
        yield prom


def dra_panel_results(prometheus: SandboxPrometheus) -> dict[str, list[float]]:
    """Each dashboard query that reads the DRA series, over the time Prometheus has run (as a
    panel draws it): {where: its finite values}."""
    values = dashboard_values(prometheus.cluster.node)
    end = time.time()
    found = {}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for where, expr, instant in dashboard_queries(json.loads(path.read_text())):
            if not reads_dra(expr):
                continue
            query = fill(expr, values)
            if instant:
                got = [s.value for s in prometheus.query(query, at=end)]
            else:
                got = [
                    v
                    for series in prometheus.query_range(query, prometheus.started_at, end, 2)
                    for _, v in series.values
                ]
            found[f"{path.stem} {where}: {query}"] = [v for v in got if math.isfinite(v)]
    return found


def test_kubernetes_1_35_drops_multiple_allocations(cluster_containerd2: Cluster) -> None:
    """Why the driver publishes slots: with DRAConsumableCapacity off (1.35's default), the
    API server drops allowMultipleAllocations, so one device could serve one claim only."""
    probe = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "ate-probe-multiple-allocations"},
        "spec": {
            "driver": "probe.ate.dev",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "kvm", "allowMultipleAllocations": True}],
        },
    }
    cluster_containerd2.apply(probe)
    try:
        stored = cluster_containerd2.get_json("resourceslice", "ate-probe-multiple-allocations")
        print(f"a device written with allowMultipleAllocations is stored as {stored['spec']['devices']}")
        assert stored["spec"]["devices"] == [{"name": "kvm"}]
    finally:
        cluster_containerd2.kubectl("delete", "resourceslice", "ate-probe-multiple-allocations", check=False)


def test_the_node_falls_back_to_its_kvm_slots(cluster_containerd2: Cluster, installed: None) -> None:
    """The driver first writes the shareable devices, reads back that 1.35 dropped their
    allowMultipleAllocations, and publishes the slots alone (of both resources)."""
    pod = wait_plugin_ready(cluster_containerd2)
    names = wait_until("the node's slots, the KVM ones probed", partial(probed_slots, cluster_containerd2), 60)
    print("kubectl get resourceslices:\n" + cluster_containerd2.kubectl("get", "resourceslices", "-o", "wide"))
    assert names == ALL_SLOTS
    [item] = slices(cluster_containerd2)
    assert item["spec"]["nodeName"] == NODE
    assert item["spec"]["pool"]["name"] == NODE
    [owner] = item["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Node", NODE)
    for device in item["spec"]["devices"]:
        resource = RESOURCE if device["name"].startswith("ate-dev-kvm-") else TUN
        assert attributes(device)["resource"] == resource, device
        if resource == TUN:  # the probe's attributes are KVM's alone
            assert attributes(device) == {"resource": TUN}, device
    values = metrics(cluster_containerd2, pod)
    assert sample(values, "ate_devplugin_dra_registered") == 1
    assert sample(values, "ate_devplugin_dra_slice_devices", resource_name=RESOURCE) == SLOTS
    assert sample(values, "ate_devplugin_dra_sharing", model="slots") == 1
    assert sample(values, "ate_devplugin_dra_sharing", model="capacity") == 0
    logs = cluster_containerd2.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"])
    [line] = [json.loads(line) for line in logs.splitlines() if "dropped allowMultipleAllocations" in line]
    print(f"the plugin's log: {line['msg']}")
    # Created with the shareable device, updated with the slots alone and, unless its verdict
    # came first, with the probe's attributes; then what the API server stores matches what
    # the driver wants: no rewrite loop.
    assert sample(values, "ate_devplugin_dra_slice_writes_total", op="create", result="success") == 1
    updates = sample(values, "ate_devplugin_dra_slice_writes_total", op="update", result="success")
    assert updates in (1, 2)
    assert item["spec"]["pool"]["generation"] == 1 + (updates or 0)
    # DRA only: no unit of the extended resource on the node (a device plugin that ran
    # before, e.g. test_cdi.py's, leaves the kubelet listing it at 0).
    assert cluster_containerd2.node.resource("allocatable", RESOURCE) in (None, "0")
    assert exists_on_node(cluster_containerd2, SPEC_FILE)


def test_qemu_boots_through_a_claim(cluster_containerd2: Cluster, installed: None) -> None:
    """The worker with a ResourceClaimTemplate for kvm.ate.dev and tun.ate.dev instead of
    its extended resources: the init container makes the tap through the claim's tun,
    QEMU (uid 10001, no capability) boots the guest on the claim's /dev/kvm."""
    run = run_pod(cluster_containerd2, claiming(worker("dra-qemu")))
    booted_as_shipped(run, cluster_containerd2.cgroup)
    mode, _uid, _gid, device = run.nodes()["/dev/kvm"].split()
    assert (mode, device) == ("crw-rw-rw-", "a:e8"), run.nodes()


def holder(name: str) -> dict[str, Any]:
    pod = claiming(worker(name, hold=True))
    pod["metadata"]["name"] = f"{name}-{uuid.uuid4().hex[:6]}"
    return pod


def holder_report(cluster: Cluster, name: str) -> QemuRun | None:
    """What the holder's QEMU printed, once it ran (the pod keeps running after it)."""
    pod = cluster.get_json("pod", "-n", MICROVM_WORKERS, name)
    if pod["status"].get("phase") != "Running":
        return None
    logs = cluster.kubectl("logs", "-n", MICROVM_WORKERS, name, "-c", "vmm", check=False)
    return QemuRun(logs, node=pod["spec"]["nodeName"]) if "ate-e2e: qemu exit=" in logs else None


def _report(cluster: Cluster, name: str) -> Callable[[], QemuRun | None]:
    return lambda: holder_report(cluster, name)


def test_helm_test_verifies_through_a_claim(
    cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None
) -> None:
    """dra mode: the chart's test pod gets /dev/kvm through a ResourceClaimTemplate of
    kvm.ate.dev (no extended resource), UID 0 with no capability, and verify runs a VM."""
    start = time.monotonic()
    out = helm_containerd2.run("test", RELEASE, "--namespace", NAMESPACE, "--logs", "--timeout", "3m", check=False)
    print(f"helm test (dra) exit {out.returncode} after {time.monotonic() - start:.1f}s:\n{out.stdout}{out.stderr}")
    assert out.returncode == 0
    (pod,) = helm_test_passed(cluster_containerd2, out.stdout)
    (claim,) = pod["spec"]["resourceClaims"]
    templates = cluster_containerd2.get_json("resourceclaimtemplates", "-n", NAMESPACE, "-l", TEST_SELECTOR)["items"]
    assert [t["metadata"]["name"] for t in templates] == [claim["resourceClaimTemplateName"]]
    (request,) = templates[0]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == DEVICE_CLASS
    assert RESOURCE not in pod["spec"]["containers"][0]["resources"].get("limits", {})
    cluster_containerd2.kubectl("delete", "pods", "-n", NAMESPACE, "-l", TEST_SELECTOR, "--wait=true", timeout=120)


def test_a_second_dra_release_is_refused_before_anything_is_applied(
    cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None
) -> None:
    """The DeviceClasses are cluster-wide: a second DRA release (its own namespace) that would
    make its own fails at install, saying whose class it is and what to set; nothing of it is
    left behind."""
    start = time.monotonic()
    out = helm_containerd2.run("install", "second", *helm_containerd2.chart, "--namespace", "second",
                               "--create-namespace", *helm_containerd2.image_values, "--set", "dra.mode=dra",
                               check=False)  # fmt: skip
    print(f"second release: exit {out.returncode} after {time.monotonic() - start:.1f}s: {out.stderr.strip()}")
    assert out.returncode != 0
    assert (
        f"DeviceClass {DEVICE_CLASS} exists already, made by release {RELEASE} in namespace {NAMESPACE}. "
        "DeviceClasses are cluster-wide"
    ) in out.stderr, out.stderr
    assert "install this release with dra.deviceClasses=false" in out.stderr
    assert helm_containerd2.run("status", "second", "-n", "second", check=False).returncode != 0
    assert not cluster_containerd2.get_json("daemonsets", "-n", "second")["items"]
    cluster_containerd2.kubectl("delete", "namespace", "second", "--ignore-not-found", "--wait=false")


def test_two_pods_hold_kvm_at_once_the_dra_panels_show_them_and_deleting_them_unprepares(
    cluster_containerd2: Cluster, installed: None, prometheus: SandboxPrometheus
) -> None:
    before = plugin_metrics(cluster_containerd2)
    unprepared = sample(before, "ate_devplugin_dra_claims_total", method="NodeUnprepareResources", result="success")
    # Scraped before the prepare calls, so that their counts and latencies show as increases.
    prometheus.wait_for("ate_devplugin_dra_claims_prepared == 0", timeout=120)
    pods = [holder("dra-share-a"), holder("dra-share-b")]
    names = [p["metadata"]["name"] for p in pods]
    for pod in pods:
        cluster_containerd2.apply(pod)
    try:
        reports = [wait_until(f"{n} holding /dev/kvm", _report(cluster_containerd2, n), 180) for n in names]
        for report in reports:
            booted_as_shipped(report, cluster_containerd2.cgroup)
        claims = cluster_containerd2.get_json("resourceclaims", "-n", MICROVM_WORKERS)["items"]
        devices = sorted(
            r["device"]
            for c in claims
            if c["metadata"]["annotations"].get("resource.kubernetes.io/pod-claim-name") == "vm"
            and any(o["name"] in names for o in c["metadata"].get("ownerReferences", []))
            for r in c["status"]["allocation"]["devices"]["results"]
            if r["request"] == "kvm"
        )
        print(f"their claims were allocated: {devices}")
        assert len(set(devices)) == 2
        assert all(d.startswith("ate-dev-kvm-") for d in devices)
        assert sample(plugin_metrics(cluster_containerd2), "ate_devplugin_dra_claims_prepared") == 2
        # Every DRA panel, as the dashboards query it, while both claims are prepared.
        prometheus.wait_for("ate_devplugin_dra_claims_prepared == 2", timeout=120)
        results: dict[str, list[float]] = {}

        def every_panel_with_data() -> bool:
            results.update(dra_panel_results(prometheus))
            # A panel's last point may predate the scrape that saw both claims: query again.
            prepared = next((v for k, v in results.items() if "'Prepared claims'" in k), [])
            return all(results.values()) and prepared[-1:] == [2]

        with contextlib.suppress(ClusterError):
            wait_until("every DRA panel query with data", every_panel_with_data, 120)
        for where, found in results.items():
            print(f"{where}\n    -> {len(found)} finite values, max {max(found, default=None)}, last {found[-1:]}")
        assert len(results) >= 8
        assert all(results.values()), "queries without data:\n" + "\n".join(k for k, v in results.items() if not v)
        assert next(v for k, v in results.items() if "'Prepared claims'" in k)[-1] == 2
        assert set(next(v for k, v in results.items() if "'DRA slices in sync, by node'" in k)) == {1}
    finally:
        for name in names:
            cluster_containerd2.kubectl("delete", "pod", "-n", MICROVM_WORKERS, name, "--wait=true", timeout=180)

    def unprepared_both() -> bool:
        values = plugin_metrics(cluster_containerd2)
        done = sample(values, "ate_devplugin_dra_claims_total", method="NodeUnprepareResources", result="success")
        return (done or 0) >= (unprepared or 0) + 2 and sample(values, "ate_devplugin_dra_claims_prepared") == 0

    wait_until("both claims unprepared", unprepared_both, 120)


def test_a_kubelet_restart_keeps_it_working(cluster_containerd2: Cluster, installed: None) -> None:
    created = {s["metadata"]["uid"] for s in slices(cluster_containerd2)}
    node = cluster_containerd2.node
    node.stop_kubelet()
    node.start_kubelet()
    node.wait_ready()
    # The new kubelet deletes every slice of its node; the driver writes them again.
    started = time.monotonic()
    wait_until(
        "slices written again",
        lambda: (
            {s["metadata"]["uid"] for s in slices(cluster_containerd2)} - created
            and slice_devices(cluster_containerd2) == ALL_SLOTS
        ),
        120,
    )
    print(f"slices back {time.monotonic() - started:.1f}s after the kubelet restart")
    booted_as_shipped(run_pod(cluster_containerd2, claiming(worker("dra-after-kubelet"))), cluster_containerd2.cgroup)


def test_a_plugin_restart_keeps_it_working(cluster_containerd2: Cluster, installed: None) -> None:
    [old] = plugin_pods(cluster_containerd2)
    cluster_containerd2.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=true", timeout=120)
    new = wait_plugin_ready(cluster_containerd2)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    wait_until("slices published", lambda: len(slice_devices(cluster_containerd2)) == 2 * SLOTS or None, 60)
    booted_as_shipped(run_pod(cluster_containerd2, claiming(worker("dra-after-plugin"))), cluster_containerd2.cgroup)


def test_helm_uninstall_removes_slices_specs_and_sockets(
    cluster_containerd2: Cluster, helm_containerd2: Helm, installed: None
) -> None:
    """helm v4 without --wait: the chart's pre-delete hook stops the driver before helm
    deletes its identity, so its slices are gone when the command returns, well before the
    kubelet's own cleanup (30 s after the driver went) could have removed them."""
    assert slices(cluster_containerd2)
    assert exists_on_node(cluster_containerd2, REGISTRATION_SOCKET)
    assert exists_on_node(cluster_containerd2, DRA_SOCKET)
    helm_v4 = make_helm("v4", cluster_containerd2)
    start = time.monotonic()
    helm_v4.run("uninstall", RELEASE, "--namespace", NAMESPACE)
    took = time.monotonic() - start
    left = [s["metadata"]["name"] for s in slices(cluster_containerd2)]
    print(f"helm v4 uninstall (no --wait) returned after {took:.1f}s; the driver's slices then: {left}")
    assert left == []
    assert took < 30
    wait_until("the CDI spec removed", lambda: not exists_on_node(cluster_containerd2, SPEC_FILE), 60)
    assert not exists_on_node(cluster_containerd2, REGISTRATION_SOCKET)
    assert not exists_on_node(cluster_containerd2, DRA_SOCKET)
    assert not cluster_containerd2.get_json("deviceclasses")["items"]
