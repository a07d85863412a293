"""DRA as the design plans it, on the two-node Kubernetes 1.37 cluster (containerd 2, CDI,
cgroup v2): one shareable device per resource, the worker's pod spec (``ate.dev/kvm: 1``
and ``ate.dev/tun: 1``) served by DRA where no device plugin advertises them, one
Deployment on a device-plugin node and a DRA node at once, the migration of the
device-plugin node with docs/runbook.md's steps, and device health in the pods' own
status in both modes. Every consumer is the micro-VM worker: QEMU boots its guest with a
NIC on the /dev/kvm and the tap it got (tests/e2e/vmm.py), then keeps running.

Two releases of the chart, one per node pool (label ``ate.dev/pool``): ``ate-devplugin``
in device-plugin mode for ``device-plugin`` nodes, ``ate-devplugin-dra`` in DRA mode (its
DeviceClass names ``ate.dev/kvm`` as its extendedResourceName) for ``dra`` nodes. The
first node (``e2e-node``) starts in no pool, the second (``e2e-node-2``) in ``dra``. Both
plugins watch a device directory of their node's own (``hostPaths.dev``) holding a node
of /dev/kvm's major:minor, so the device can go away and come back without touching the
host's /dev.

The pods: the worker (docs/examples/microvm-worker-pod.yaml) as shipped, with the VMM
image; in the Deployment ``microvm-worker`` its pod spec is the template, with
restartPolicy Always (a Deployment's only) and a CPU request of 50m instead of 500m, so that
sixteen replicas fit a node of two CPUs. Neither is edited after it is created: the
scheduler alone decides how each pod gets the devices.

The two releases are installed side by side as the runbook does: neither replaces an
object of the other (their manifests name no object twice, each object in the cluster is
its own release's), and the device-plugin release's install leaves the DRA plugin running.

The tests run in file order and share both releases. The last one uninstalls them: the
device-plugin release first (the DRA release keeps everything), then the DRA release with
`helm uninstall --wait`, whose pre-delete hook stops the driver pods while their identity
still exists: the driver deletes its nodes' slices itself, and none is left when the
command returns (the kubelet's own cleanup comes 30 s after a driver went, and the whole
uninstall takes less than that).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import Cluster, ClusterError, Node, wait_until
from tests.e2e.userpath import (
    CHART,
    CLAIM_TEMPLATE,
    IMAGE_VALUES,
    MICROVM_WORKERS,
    NAMESPACE,
    RESOURCE,
    TUN,
    Helm,
    attributes,
    booted_as_shipped,
    claiming,
    ensure_workload_namespace,
    is_ready,
    kvm_probed,
    metrics,
    plugin_pods,
    resource_health,
    sample,
    worker,
)
from tests.e2e.vmm import NO_KVM, QemuRun

DRIVER = "ate.dev"
DEVICE_CLASS = "kvm.ate.dev"
TUN_CLASS = "tun.ate.dev"
POOL = "ate.dev/pool"
DP_RELEASE = "ate-devplugin"
DRA_RELEASE = "ate-devplugin-dra"
SLOTS = 2
SHARED = "ate-dev-kvm"
SHARED_TUN = "ate-dev-tun"
UNITS = 4096
TUN_UNITS = 1024
PRIVATE_DEV = "/run/ate-e2e-dev"  # in each node's own /run: the host's /dev is never touched
KVM = f"{PRIVATE_DEV}/kvm"
DEPLOYMENT = "microvm-worker"  # the worker's app.kubernetes.io/name
REPLICAS = 10
BOOTED: set[str] = set()  # the Deployment's pods whose VM was checked (each once)
RESOURCES = [
    {"name": RESOURCE, "devices": ["/dev/kvm"], "units": UNITS, "cdi": {"file_mode": "0666"}},
    {"name": TUN, "devices": ["/dev/net/tun"], "units": TUN_UNITS, "cdi": {"file_mode": "0666"}},
]
DRA_VALUES = {
    "dra": {"mode": "dra", "slots": SLOTS},
    "deviceConfig": {"resources": RESOURCES},
    "hostPaths": {"dev": PRIVATE_DEV},
    "nodeSelector": {POOL: "dra"},
}
# containerd 2 here does not give device nodes the pod's owner: the CDI spec gives the mode.
DP_VALUES = {
    "deviceConfig": {"resources": [{**r, "allocate": "cdi"} for r in RESOURCES]},
    "hostPaths": {"dev": PRIVATE_DEV},
    "nodeSelector": {POOL: "device-plugin"},
}


# --- the pods -------------------------------------------------------------------------


def example_pod() -> dict[str, Any]:
    """The worker as shipped, with the VMM image, kept running after its VM."""
    return worker("microvm-worker", hold=True)


def deployment(replicas: int) -> dict[str, Any]:
    pod = example_pod()
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        container["resources"]["requests"]["cpu"] = "50m"  # sixteen replicas on a node of two CPUs
    template = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": {**pod["spec"], "restartPolicy": "Always"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": MICROVM_WORKERS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": pod["metadata"]["labels"]}, "template": template},
    }


def pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The Deployment's pods not being deleted."""
    items = cluster.get_json("pods", "-n", MICROVM_WORKERS, "-l", f"app.kubernetes.io/name={DEPLOYMENT}")["items"]
    return [
        p
        for p in items
        if not p["metadata"].get("deletionTimestamp") and "pod-template-hash" in p["metadata"]["labels"]
    ]


class RefusedError(Exception):
    """The kubelet refused the pod at admission: it will never run (its controller makes another)."""


def report(cluster: Cluster, pod: dict[str, Any]) -> QemuRun | None:
    """What the pod's QEMU printed, once it ran (the pod keeps running after it)."""
    name = pod["metadata"]["name"]
    current = cluster.get_json("pod", "-n", MICROVM_WORKERS, name)
    status = current["status"]
    if status.get("phase") == "Failed" and status.get("reason") == "UnexpectedAdmissionError":
        node = current["spec"]["nodeName"]
        allocatable = cluster.get_json("node", node)["status"].get("allocatable", {})
        raise RefusedError(
            f"{name} refused at admission on {node}: {status.get('message')}; its extendedResourceClaimStatus: "
            f"{status.get('extendedResourceClaimStatus')}; the node's allocatable now: "
            f"{ {k: v for k, v in allocatable.items() if k.startswith('ate.dev/')} }"
        )
    if status.get("phase") != "Running":
        return None
    logs = cluster.kubectl("logs", "-n", MICROVM_WORKERS, name, "-c", "vmm", check=False)
    return QemuRun(logs, node=current["spec"]["nodeName"]) if "ate-e2e: qemu exit=" in logs else None


def wait_report(cluster: Cluster, pod: dict[str, Any], timeout: float = 180) -> QemuRun:
    name = pod["metadata"]["name"]
    try:
        return wait_until(f"{name} running its VM", lambda: report(cluster, pod), timeout)
    except ClusterError:
        print(cluster.kubectl("describe", "pod", "-n", MICROVM_WORKERS, name, check=False))
        raise


def started(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """Apply ``pod`` under a fresh name and return it as the API server holds it once it runs."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] += "-" + uuid.uuid4().hex[:6]
    cluster.apply(pod)
    wait_report(cluster, pod)
    got: dict[str, Any] = cluster.get_json("pod", "-n", MICROVM_WORKERS, pod["metadata"]["name"])
    return got


def delete(cluster: Cluster, *names: str) -> None:
    if names:
        cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, *names, "--wait=true", timeout=180)


def claim_of(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any] | None:
    """The ResourceClaim the scheduler made for the pod's extended resource (None: device plugin)."""
    status = pod["status"].get("extendedResourceClaimStatus")
    if not status:
        return None
    found: dict[str, Any] = cluster.get_json("resourceclaim", "-n", MICROVM_WORKERS, status["resourceClaimName"])
    return found


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's allocated devices of ``ate.dev/kvm`` (its tun devices left out)."""
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return [r for r in found if r["device"].startswith(SHARED)]


def healths(cluster: Cluster, name: str) -> set[str]:
    """The health of the pod's /dev/kvm devices: its claim's (resource ID ``ate.dev/kvm=...``)
    or the device plugin's (the entry named ``ate.dev/kvm``)."""
    return {
        r.get("health", "")
        for s in resource_health(cluster, MICROVM_WORKERS, name)
        for r in s.get("resources", [])
        if s["name"] == RESOURCE or r["resourceID"].startswith(f"{RESOURCE}=")
    }


# --- the node side --------------------------------------------------------------------


def node_of(cluster: Cluster, name: str) -> Node:
    return next(n for n in cluster.nodes if n.name == name)


def plugin_pod(cluster: Cluster, release: str, node: Node) -> dict[str, Any] | None:
    """The release's Ready daemon pod on the node (the prober's pods are not plugin pods)."""
    return next(
        (p for p in plugin_pods(cluster, node)
         if p["metadata"]["labels"].get("app.kubernetes.io/instance") == release and is_ready(p)),
        None,
    )  # fmt: skip


def wait_plugin(cluster: Cluster, release: str, node: Node) -> dict[str, Any]:
    return wait_until(f"the {release} pod Ready on {node.name}", lambda: plugin_pod(cluster, release, node), 240)


def no_plugin(cluster: Cluster, release: str, node: Node) -> bool:
    """Whether no pod of the release (daemon or prober) is left on the node."""
    items = cluster.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={release}")["items"]
    return not [p for p in items if p["spec"].get("nodeName") == node.name]


def slices(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("resourceslices")["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == node.name]


def devices(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    return [d for s in slices(cluster, node) for d in s["spec"].get("devices", [])]


def wait_devices(cluster: Cluster, node: Node, count: int, probed: bool = False) -> list[dict[str, Any]]:
    """The node's ``count`` devices; with ``probed``, once the KVM ones carry the probe's attributes."""

    def published() -> list[dict[str, Any]] | None:
        found = devices(cluster, node)
        kvm = [d for d in found if attributes(d)["resource"] == RESOURCE]
        return found if len(found) == count and (not probed or all(kvm_probed(d) for d in kvm)) else None

    return wait_until(f"{count} devices in {node.name}'s slices", published, 120)


def release_objects(helm: Helm, release: str) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of each object of the release's manifest (hooks aside)."""
    manifest = helm.run("get", "manifest", release, "--namespace", NAMESPACE).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    return [(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs]


def live(cluster: Cluster, objects: list[tuple[str, str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Those of ``objects`` the API server holds, by (kind, name), in one request (kubectl
    ignores the namespace for cluster-scoped kinds; every namespaced one is in NAMESPACE)."""
    assert {namespace for _, namespace, _ in objects} <= {NAMESPACE, ""}
    found = cluster.get_json("--namespace", NAMESPACE, "--ignore-not-found", *[f"{k}/{n}" for k, _, n in objects])
    items = found.get("items", [found]) if found else []  # one object: the object itself
    return {(i["kind"], i["metadata"]["name"]): i for i in items}


def install(helm: Helm, release: str, values: dict[str, Any]) -> None:
    helm.run("install", release, str(CHART), "--namespace", NAMESPACE, "--create-namespace", *IMAGE_VALUES,
             "--set-json", f"deviceConfig={json.dumps(values.pop('deviceConfig'))}",
             *[a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")],
             "--wait", "--timeout", "5m")  # fmt: skip


def kvm_present(node: Node, present: bool) -> None:
    """The plugins' device node on ``node`` (their /dev): made, or removed as by an unloaded module."""
    if present:
        node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; [ -e {KVM} ] || mknod -m 0600 {KVM} c 10 232"])
    else:
        node.run(["rm", "-f", KVM])


@contextlib.contextmanager
def cordoned(cluster: Cluster, node: Node) -> Iterator[None]:
    cluster.kubectl("cordon", node.name)
    try:
        yield
    finally:
        cluster.kubectl("uncordon", node.name)


def scale(cluster: Cluster, replicas: int) -> list[dict[str, Any]]:
    """Scale the Deployment; its pods once every one runs its micro-VM."""
    cluster.kubectl("scale", "deployment", "-n", MICROVM_WORKERS, DEPLOYMENT, f"--replicas={replicas}")
    try:
        wait_until(f"{replicas} pods of {DEPLOYMENT}", lambda: len(pods(cluster)) == replicas, 120)
    except ClusterError:
        for pod in pods(cluster):  # what each one is stuck at, for the failure's output
            status = pod.get("status", {})
            conditions = [(c["type"], c["status"], c.get("reason", "")) for c in status.get("conditions", [])]
            print(pod["metadata"]["name"], pod["spec"].get("nodeName"), status.get("phase"),
                  status.get("reason"), status.get("message"), conditions)  # fmt: skip
        print(cluster.kubectl("get", "events", "-n", MICROVM_WORKERS, "--sort-by=.lastTimestamp", check=False))
        raise
    found = pods(cluster)
    for pod in found:
        if pod["metadata"]["uid"] not in BOOTED:
            booted_as_shipped(wait_report(cluster, pod), cluster.cgroup)
            BOOTED.add(pod["metadata"]["uid"])
    return pods(cluster)


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodes(cluster_137: Cluster) -> Iterator[tuple[Node, Node]]:
    """The two nodes with the plugins' device nodes (kvm and net/tun); removed again at the
    end (after both releases), so the later modules on this cluster find the nodes' /run
    as it was."""
    first, second = cluster_137.nodes
    try:
        for node in (first, second):
            kvm_present(node, True)
            node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}/net; mknod -m 0600 {PRIVATE_DEV}/net/tun c 10 200"])
        yield first, second
    finally:
        for node in (first, second):
            node.run(["rm", "-rf", PRIVATE_DEV])


@pytest.fixture(scope="module")
def dra_installed(cluster_137: Cluster, helm_137: Helm, nodes: tuple[Node, Node]) -> Iterator[None]:
    _, second = nodes
    second.label({POOL: "dra"})
    try:
        install(helm_137, DRA_RELEASE, copy.deepcopy(DRA_VALUES))
        ensure_workload_namespace(cluster_137)
        cluster_137.apply(CLAIM_TEMPLATE)
        yield
    finally:
        cluster_137.kubectl("delete", "deployment", "-n", MICROVM_WORKERS, DEPLOYMENT, "--ignore-not-found",
                            "--wait=true", timeout=180)  # fmt: skip
        for release in (DP_RELEASE, DRA_RELEASE):
            if helm_137.run("status", release, "-n", NAMESPACE, check=False).returncode == 0:
                helm_137.run("uninstall", release, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
        for node in nodes:
            node.label({POOL: None})


# --- 1. one shareable device per resource -----------------------------------------------


def test_the_dra_node_publishes_one_shareable_device_and_its_slots(
    cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None
) -> None:
    first, second = nodes
    plugin = wait_plugin(cluster_137, DRA_RELEASE, second)
    found = wait_devices(cluster_137, second, 2 * (1 + SLOTS), probed=True)
    print("kubectl get resourceslices -o yaml (devices):\n" + yaml.safe_dump(found))
    shared, *slots = [d for d in found if attributes(d)["resource"] == RESOURCE]
    assert [d["name"] for d in found if attributes(d) == {"resource": TUN}] == [
        SHARED_TUN,
        *(f"{SHARED_TUN}-{i}" for i in range(SLOTS)),
    ]
    assert kvm_probed(shared)  # beside its resource, the probe's attributes (the prober is on by default)
    assert {**shared, "attributes": shared["attributes"]["resource"]} == {
        "name": SHARED,
        "attributes": {"string": RESOURCE},
        "allowMultipleAllocations": True,
        "capacity": {"shares": {"value": str(UNITS), "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": str(UNITS), "step": "1"}}}},
    }  # fmt: skip
    assert [d["name"] for d in slots] == [f"{SHARED}-{i}" for i in range(SLOTS)]
    values = metrics(cluster_137, plugin)
    assert sample(values, "ate_devplugin_dra_sharing", model="capacity") == 1
    assert sample(values, "ate_devplugin_dra_slice_devices", resource_name=RESOURCE) == 1 + SLOTS
    # Written once, and again with the probe's attributes unless its verdict came first: the
    # 1.37 API server kept every field, so nothing was written for anything else.
    updates = sample(values, "ate_devplugin_dra_slice_writes_total", op="update", result="success")
    assert updates in (0, 1)
    [item] = slices(cluster_137, second)
    assert item["spec"]["pool"]["generation"] == 1 + (updates or 0)
    classes = {c["metadata"]["name"]: c["spec"] for c in cluster_137.get_json("deviceclasses")["items"]}
    assert classes[DEVICE_CLASS]["extendedResourceName"] == RESOURCE
    assert classes[TUN_CLASS]["extendedResourceName"] == TUN
    # No device-plugin units on either node ("0": the kubelet still lists a resource a plugin
    # served before, as the user path's release did when it ran first on this cluster).
    assert second.resource("allocatable", RESOURCE) in (None, "0")
    assert first.resource("allocatable", RESOURCE) in (None, "0")  # no plugin there yet


# --- 2. the README's pod spec on a DRA node ----------------------------------------------


def test_the_worker_boots_its_vm_on_the_dra_node_through_a_generated_claim(
    cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None
) -> None:
    """The worker's pod spec as shipped (``ate.dev/kvm: 1``, ``ate.dev/tun: 1``) where no
    device plugin advertises either: the scheduler makes it a claim from the DeviceClasses
    that name them, and QEMU boots its guest on what the claim prepared."""
    _, second = nodes
    pod = started(cluster_137, example_pod())
    name = pod["metadata"]["name"]
    try:
        found = wait_report(cluster_137, pod)
        booted_as_shipped(found, cluster_137.cgroup)
        assert pod["spec"]["nodeName"] == second.name
        claim = claim_of(cluster_137, pod)
        assert claim is not None, "no extendedResourceClaimStatus: not served by DRA"
        shown = {"spec": claim["spec"], "status": claim["status"]}
        print(f"generated claim {claim['metadata']['name']}:\n{yaml.safe_dump(shown)}")
        assert claim["metadata"]["name"].startswith(f"{name}-extended-resources-")
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        requests = claim["spec"]["devices"]["requests"]
        [request] = [r for r in requests if r["exactly"]["deviceClassName"] == DEVICE_CLASS]
        assert request["exactly"].get("count", 1) == 1
        assert {r["exactly"]["deviceClassName"] for r in requests} == {DEVICE_CLASS, TUN_CLASS}
        [result] = results(claim)
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, second.name, SHARED)
        assert result["shareID"]
        assert result["consumedCapacity"] == {"shares": "1"}
        mappings = pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
        assert [m for m in mappings if m["resourceName"] == RESOURCE] == [
            {"containerName": "vmm", "resourceName": RESOURCE, "requestName": request["name"]}
        ], mappings
        assert {m["containerName"] for m in mappings if m["resourceName"] == TUN} == {"tap", "vmm"}, mappings
    finally:
        delete(cluster_137, name)


def test_a_pod_without_the_request_cannot_open_kvm(
    cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None
) -> None:
    got = started(cluster_137, worker("microvm-worker", kvm=False, hold=True))
    try:
        found = wait_report(cluster_137, got)
        print(f"without ate.dev/kvm: {found.logs.strip()}")
        assert found.qemu_exit == 1, found.logs
        assert NO_KVM in found.logs
        claim = claim_of(cluster_137, got)
        assert claim is not None
        assert results(claim) == []  # its tun only
    finally:
        delete(cluster_137, got["metadata"]["name"])


def test_two_units_are_two_distinct_devices(
    cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None
) -> None:
    """``ate.dev/kvm: 2`` is a request for two devices: the shareable one and a slot, one
    /dev/kvm in the container (the driver names the CDI device once per request)."""
    pod = example_pod()
    pod["metadata"]["name"] = "kvm-two-units"
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = 2
    got = started(cluster_137, pod)
    try:
        booted_as_shipped(wait_report(cluster_137, got), cluster_137.cgroup)
        claim = claim_of(cluster_137, got)
        assert claim is not None
        allocated = sorted(r["device"] for r in results(claim))
        print(f"ate.dev/kvm: 2 was allocated {allocated}")
        assert allocated == [SHARED, f"{SHARED}-0"]
    finally:
        delete(cluster_137, got["metadata"]["name"])


# --- 3. DRA health in the pod's status ----------------------------------------------------


def test_dra_device_health_shows_in_the_pod_status(
    cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None
) -> None:
    """A pod with a claim from a template sees its device Unhealthy while /dev/kvm is gone and
    Healthy when it is back. A pod served through the extended resource gets no DRA health:
    the kubelet reports it only for containers with resources.claims (kubernetes/kubernetes#140060;
    v1.37.2 pkg/kubelet/cm/dra/manager.go, UpdateAllocatedResourcesStatus skips a container
    whose Resources.Claims is empty)."""
    _, second = nodes
    claimed = claiming(example_pod())
    claimed["metadata"]["name"] = "kvm-claim"
    with_claim = started(cluster_137, claimed)
    extended = started(cluster_137, example_pod())
    names = [with_claim["metadata"]["name"], extended["metadata"]["name"]]
    try:
        plugin = wait_plugin(cluster_137, DRA_RELEASE, second)
        assert sample(metrics(cluster_137, plugin), "ate_devplugin_dra_health_streams", version="v1") == 1
        wait_until("Healthy in the pod status", lambda: healths(cluster_137, names[0]) == {"Healthy"}, 120)
        kvm_present(second, False)
        try:
            wait_until("Unhealthy in the pod status", lambda: healths(cluster_137, names[0]) == {"Unhealthy"}, 120)
            status = resource_health(cluster_137, MICROVM_WORKERS, names[0])
            print(f"kubectl get pod {names[0]} -o yaml: allocatedResourcesStatus:\n{yaml.safe_dump(status)}")
            [entry] = status
            assert entry["name"] == "claim:vm"
            [device] = [r for r in entry["resources"] if r["resourceID"] == "ate.dev/kvm=kvm"]
            assert device["message"] == "ate.dev/kvm: device node missing (/dev/kvm)"
            [tun] = [r for r in entry["resources"] if r["resourceID"] == "ate.dev/tun=tun"]
            assert tun["health"] == "Healthy"
            assert resource_health(cluster_137, MICROVM_WORKERS, names[1]) == []  # kubernetes/kubernetes#140060
        finally:
            kvm_present(second, True)
        wait_until("Healthy again", lambda: healths(cluster_137, names[0]) == {"Healthy"}, 120)
        print(f"back: {yaml.safe_dump(resource_health(cluster_137, MICROVM_WORKERS, names[0]))}")
    finally:
        delete(cluster_137, *names)
    wait_devices(cluster_137, second, 2 * (1 + SLOTS))


# --- 4. ten pods share one node's /dev/kvm -------------------------------------------------


def test_ten_replicas_share_one_nodes_kvm(cluster_137: Cluster, nodes: tuple[Node, Node], dra_installed: None) -> None:
    _, second = nodes
    cluster_137.apply(deployment(0))
    found = scale(cluster_137, REPLICAS)
    assert {p["spec"]["nodeName"] for p in found} == {second.name}
    claims = [claim_of(cluster_137, p) for p in found]
    assert all(claims)
    allocated = [(r["device"], r["shareID"]) for c in claims if c for r in results(c)]
    print(f"{REPLICAS} replicas on {second.name}, their claims: {[c['metadata']['name'] for c in claims if c]}")
    print(f"allocated: {allocated}")
    assert {d for d, _ in allocated} == {SHARED}
    assert len({s for _, s in allocated}) == REPLICAS
    plugin = wait_plugin(cluster_137, DRA_RELEASE, second)
    assert sample(metrics(cluster_137, plugin), "ate_devplugin_dra_claims_prepared") == REPLICAS


# --- 5. one Deployment on a device-plugin node and a DRA node -------------------------------


@pytest.fixture(scope="module")
def mixed(cluster_137: Cluster, helm_137: Helm, nodes: tuple[Node, Node], dra_installed: None) -> dict[str, Any]:
    """The first node joins the device-plugin pool; two more replicas land there (the DRA node
    cordoned meanwhile). Returns {"dra": the DRA node's pods, "device-plugin": the first node's,
    "dra-plugin": the DRA release's plugin pod before the device-plugin release was installed}."""
    first, second = nodes
    dra_plugin = wait_plugin(cluster_137, DRA_RELEASE, second)
    first.label({POOL: "device-plugin"})
    install(helm_137, DP_RELEASE, copy.deepcopy(DP_VALUES))
    wait_plugin(cluster_137, DP_RELEASE, first)
    first.wait_resource(RESOURCE, str(UNITS))
    before = {p["metadata"]["uid"] for p in pods(cluster_137)}
    with cordoned(cluster_137, second):
        found = scale(cluster_137, REPLICAS + 2)
    new = [p for p in found if p["metadata"]["uid"] not in before]
    return {"dra": [p for p in found if p["metadata"]["uid"] in before], "device-plugin": new, "dra-plugin": dra_plugin}


def test_one_deployment_runs_on_a_device_plugin_node_and_a_dra_node(
    cluster_137: Cluster, nodes: tuple[Node, Node], mixed: dict[str, Any]
) -> None:
    first, second = nodes
    on = {node.name: [p for p in pods(cluster_137) if p["spec"]["nodeName"] == node.name] for node in nodes}
    print({n: [p["metadata"]["name"] for p in ps] for n, ps in on.items()})
    assert len(on[first.name]) == 2
    assert len(on[second.name]) == REPLICAS
    for pod in on[first.name]:  # the device plugin's: no claim, a unit of the node's allocatable
        assert claim_of(cluster_137, pod) is None
    for pod in on[second.name]:
        claim = claim_of(cluster_137, pod)
        assert claim is not None
        assert [r["device"] for r in results(claim)] == [SHARED]
    assert first.resource("allocatable", RESOURCE) == str(UNITS)
    assert first.resource("allocatable", TUN) == str(TUN_UNITS)
    assert second.resource("allocatable", RESOURCE) in (None, "0")
    # The same pod template: the scheduler chose the way per node.
    templates = {json.dumps(p["spec"]["containers"][0]["resources"], sort_keys=True) for p in pods(cluster_137)}
    assert len(templates) == 1


def test_the_two_releases_keep_each_their_own_objects(
    cluster_137: Cluster, helm_137: Helm, nodes: tuple[Node, Node], mixed: dict[str, Any]
) -> None:
    """Installed side by side, as the runbook's migration does: no object is in both
    releases (ConfigMaps, ClusterRoles, DeviceClasses, dashboards, ...), each object in the
    cluster belongs to the release that made it, each plugin reads its own release's
    config, and installing the device-plugin release left the DRA plugin pod as it was."""
    _, second = nodes
    objects = {release: release_objects(helm_137, release) for release in (DP_RELEASE, DRA_RELEASE)}
    for release, found in objects.items():
        print(f"{release}: {len(found)} objects: {sorted(found)}")
    assert not set(objects[DP_RELEASE]) & set(objects[DRA_RELEASE])
    for release, found in objects.items():
        owners = {
            key: i["metadata"]["annotations"]["meta.helm.sh/release-name"]
            for key, i in live(cluster_137, found).items()
        }
        assert owners == {(kind, name): release for kind, _, name in found}
    kinds = {release: {kind for kind, _, _ in found} for release, found in objects.items()}
    assert {"ClusterRole", "ClusterRoleBinding", "DeviceClass"} <= kinds[DRA_RELEASE]
    dashboards = {
        release: sorted(n for k, _, n in found if k == "ConfigMap" and "dashboard" in n)
        for release, found in objects.items()
    }
    assert dashboards[DP_RELEASE]
    assert len(dashboards[DRA_RELEASE]) == len(dashboards[DP_RELEASE])
    # Grafana keeps one dashboard per uid: each release's boards have their own.
    uids = {
        release: {
            json.loads(board)["uid"]
            for name in names
            for board in live(cluster_137, [("ConfigMap", NAMESPACE, name)])[("ConfigMap", name)]["data"].values()
        }
        for release, names in dashboards.items()
    }
    print(f"dashboard uids: {uids}")
    assert len(uids[DP_RELEASE]) == len(uids[DRA_RELEASE]) >= 2
    assert not uids[DP_RELEASE] & uids[DRA_RELEASE]
    # Each DaemonSet mounts its own release's config, which is that release's values.
    for release, allocate in ((DP_RELEASE, "cdi"), (DRA_RELEASE, None)):
        ds, prober = sorted(n for k, _, n in objects[release] if k == "DaemonSet")
        assert prober == f"{ds}-kvm-prober"  # the daemon's and its KVM prober's (on by default)
        volumes = live(cluster_137, [("DaemonSet", NAMESPACE, ds)])[("DaemonSet", ds)]["spec"]["template"]["spec"][
            "volumes"
        ]
        (config_map,) = [v["configMap"]["name"] for v in volumes if "configMap" in v]
        assert ("ConfigMap", NAMESPACE, config_map) in objects[release]
        data = live(cluster_137, [("ConfigMap", NAMESPACE, config_map)])[("ConfigMap", config_map)]["data"]
        config = yaml.safe_load(data["config.yaml"])
        assert config["resources"][0].get("allocate") == allocate, (release, config)
    before = mixed["dra-plugin"]
    now = wait_plugin(cluster_137, DRA_RELEASE, second)
    assert now["metadata"]["uid"] == before["metadata"]["uid"]
    assert (
        now["status"]["containerStatuses"][0]["restartCount"]
        == before["status"]["containerStatuses"][0]["restartCount"]
    )


def test_device_plugin_health_shows_in_the_pod_status(
    cluster_137: Cluster, nodes: tuple[Node, Node], mixed: dict[str, Any]
) -> None:
    first, _ = nodes
    name = mixed["device-plugin"][0]["metadata"]["name"]
    wait_until("Healthy in the pod status", lambda: healths(cluster_137, name) == {"Healthy"}, 120)
    kvm_present(first, False)
    try:
        wait_until("Unhealthy in the pod status", lambda: healths(cluster_137, name) == {"Unhealthy"}, 120)
        status = resource_health(cluster_137, MICROVM_WORKERS, name)
        print(f"kubectl get pod {name} -o yaml: allocatedResourcesStatus:\n{yaml.safe_dump(status)}")
        [entry] = [e for e in status if e["name"] == RESOURCE]
        [unit] = entry["resources"]
        assert unit["resourceID"].startswith("kvm-")
        first.wait_resource(RESOURCE, "0")
    finally:
        kvm_present(first, True)
    wait_until("Healthy again", lambda: healths(cluster_137, name) == {"Healthy"}, 120)
    first.wait_resource(RESOURCE, str(UNITS))


# --- 6. the device-plugin node migrated to DRA ---------------------------------------------


def test_migrating_the_device_plugin_node_to_dra(
    cluster_137: Cluster, nodes: tuple[Node, Node], mixed: dict[str, Any]
) -> None:
    """docs/runbook.md's steps, with no pod spec edited: cordon, drain the pods holding the
    device plugin's units, take the node out of the device-plugin pool and wait for its
    plugin to go, put it in the DRA pool, uncordon. The other node's pods run on untouched;
    new replicas land on both nodes through DRA."""
    first, second = nodes
    untouched = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in mixed["dra"]}
    cluster_137.kubectl("cordon", first.name)
    cluster_137.kubectl("drain", first.name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s",
                        timeout=240)  # fmt: skip
    first.label({POOL: None})
    wait_until("the device plugin gone from the node", lambda: no_plugin(cluster_137, DP_RELEASE, first), 120)
    # Until the kubelet posts allocatable 0 (every 10 s) the scheduler sends pods the
    # device plugin's way there, and the kubelet refuses them: the runbook waits, so do we.
    gone = time.monotonic()
    for name in (RESOURCE, TUN):
        first.wait_resource(name, "0")
    print(f"allocatable 0 posted {time.monotonic() - gone:.1f}s after the plugin pod went")
    first.label({POOL: "dra"})
    wait_plugin(cluster_137, DRA_RELEASE, first)
    wait_devices(cluster_137, first, 2 * (1 + SLOTS))
    # The drained replicas came back on the DRA node, running their micro-VMs, while the
    # first was cordoned.
    back = scale(cluster_137, REPLICAS + 2)
    assert {p["spec"]["nodeName"] for p in back} == {second.name}
    cluster_137.kubectl("uncordon", first.name)
    before = {p["metadata"]["uid"] for p in back}
    with cordoned(cluster_137, second):
        scale(cluster_137, REPLICAS + 4)
    with cordoned(cluster_137, first):
        found = scale(cluster_137, REPLICAS + 6)
    new = [p for p in found if p["metadata"]["uid"] not in before]
    on = {node.name: [p for p in new if p["spec"]["nodeName"] == node.name] for node in nodes}
    print({n: [p["metadata"]["name"] for p in ps] for n, ps in on.items()})
    assert len(on[first.name]) == 2
    assert len(on[second.name]) == 2
    for node in nodes:
        for pod in on[node.name]:
            claim = claim_of(cluster_137, pod)
            assert claim is not None, f"{pod['metadata']['name']} not served by DRA"
            assert [(r["pool"], r["device"]) for r in results(claim)] == [(node.name, SHARED)]
    # Nothing of the DRA node's first pods was disturbed.
    now = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods(cluster_137)}
    assert {uid: now.get(uid) for uid in untouched} == untouched


# --- 7. uninstalled: one release leaves the other alone; the slices go before helm returns -------


@contextlib.contextmanager
def following_logs(cluster: Cluster, pods: list[dict[str, Any]]) -> Iterator[Callable[[], list[str]]]:
    """``kubectl logs -f`` of each pod while the block runs (a pod's lines stay readable after
    the pod is gone); yields a function returning every line seen so far."""
    kubectl = [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "logs", "-f", "-n", NAMESPACE]
    followers = [
        cluster.sandbox.spawn(f"logs-{p['metadata']['name']}-{uuid.uuid4().hex[:4]}", [*kubectl, p["metadata"]["name"]])
        for p in pods
    ]

    def lines() -> list[str]:
        return [line for f in followers for line in f.log_tail(10**7).splitlines()]

    try:
        wait_until("the logs followed", lambda: all(f.log_tail(10**7) for f in followers), 30)
        yield lines
    finally:
        for follower in followers:
            follower.stop()
            cluster.sandbox.processes.remove(follower)


def about_slices(lines: list[str]) -> list[str]:
    return [line for line in lines if "resource slices" in line]


def test_uninstalled_one_release_at_a_time_the_slices_go_before_helm_returns(
    cluster_137: Cluster, helm_137: Helm, nodes: tuple[Node, Node], mixed: dict[str, Any]
) -> None:
    cluster_137.kubectl("delete", "deployment", "-n", MICROVM_WORKERS, DEPLOYMENT, "--wait=true", timeout=180)
    wait_until("the consumers gone", lambda: not pods(cluster_137), 180)
    for node in nodes:  # after the migration both nodes are in the DRA pool
        wait_devices(cluster_137, node, 2 * (1 + SLOTS))
    # The device-plugin release first: nothing of the DRA release changes.
    dra_objects = release_objects(helm_137, DRA_RELEASE)
    uids = {key: i["metadata"]["uid"] for key, i in live(cluster_137, dra_objects).items()}
    assert len(uids) == len(dra_objects)
    plugins = [wait_plugin(cluster_137, DRA_RELEASE, node) for node in nodes]
    slice_uids = {s["metadata"]["uid"] for node in nodes for s in slices(cluster_137, node)}
    helm_137.run("uninstall", DP_RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
    assert {key: i["metadata"]["uid"] for key, i in live(cluster_137, dra_objects).items()} == uids
    assert [wait_plugin(cluster_137, DRA_RELEASE, n)["metadata"]["uid"] for n in nodes] == [
        p["metadata"]["uid"] for p in plugins
    ]
    assert {s["metadata"]["uid"] for node in nodes for s in slices(cluster_137, node)} == slice_uids
    # Then the DRA release, as a user uninstalls it.
    with following_logs(cluster_137, plugins) as logs:
        start = time.monotonic()
        out = helm_137.run("uninstall", DRA_RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")
        took = time.monotonic() - start
        left = [s["metadata"]["name"] for node in nodes for s in slices(cluster_137, node)]
        print(f"helm uninstall --wait {DRA_RELEASE} returned after {took:.1f}s: {out.stdout.strip()}")
        print(f"the driver's slices then: {left}")
        with contextlib.suppress(ClusterError):  # the asserts below say what is missing
            wait_until("each driver's shutdown in its log", lambda: len(about_slices(logs())) >= len(nodes), 10)
        shutdown = about_slices(logs())
    print("the drivers' shutdown:\n" + "\n".join(shutdown))
    assert left == []
    # The kubelet deletes a node's slices 30 s after its driver deregistered, which was after
    # `start`: in less time than that, the slices were deleted by the drivers.
    assert took < 30, f"the uninstall took {took:.1f}s: the kubelet's cleanup could have deleted the slices"
    deleted = [json.loads(line) for line in shutdown if '"resource slices deleted"' in line]
    assert len(deleted) == len(nodes), shutdown
    assert all(entry["count"] >= 1 for entry in deleted), shutdown
    assert not [line for line in shutdown if "could not delete" in line], shutdown
    # The hook cleaned up after itself; nothing of either release is left.
    assert not cluster_137.get_json("jobs,serviceaccounts,roles,rolebindings", "-n", NAMESPACE,
                                    "-l", "app.kubernetes.io/component=uninstall")["items"]  # fmt: skip
    assert live(cluster_137, dra_objects) == {}
