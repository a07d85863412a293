"""The KVM prober in DRA mode on the real 1.37 cluster (two nodes, containerd 2, cgroup v2):
the chart with ``dra.mode=dra`` (the prober on by default), its daemon unprivileged, its
prober pods (uid 0, no capability) granted /dev/kvm through one unit of ate.dev/kvm-prober,
which the daemon serves through the device plugin API in dra mode too, untouched by the
driver's taint ``ate.dev/kvm-unhealthy`` (docs/kvm-health.md, "The chart: the prober").

One release, several checks, in file order: the prober's probe passes on each node and the
node's ResourceSlice devices carry the KVM attributes (``pvm`` here, not hardware); the
CPU-model selector example of docs/kvm-health.md schedules on this machine's model and stays
Pending on another and on ``kvmHardware == true``; a 1:3 node renamed over the first node's
``kvm`` taints its devices (``not-a-kvm-device``, NoSchedule), a new claim's pod stays
Pending, a prober pod made then is still admitted; the real node back:
the taint goes and the pod runs. Each device directory is the node's own (hostPaths.dev),
the host's /dev is never touched; the CDI spec gives the node mode 0666 in containers (the
DRA way for non-root consumers, docs/non-root-consumers.md).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, ClusterError, Node, wait_until
from tests.e2e.images import PLUGIN_IMAGE
from tests.e2e.userpath import (
    NAMESPACE,
    RELEASE,
    RESOURCE,
    Helm,
    attributes,
    ensure_namespace,
    kvm_probe_states,
    kvm_probed,
    plugin_pods,
    readyz,
    wait_plugin_ready,
)

PRIVATE_DEV = "/run/ate-e2e-kvm-dra-dev"  # in each node's tmpfs: the host's /dev is never touched
KVM = f"{PRIVATE_DEV}/kvm"
DRIVER = "ate.dev"
DEVICE_CLASS = "kvm.ate.dev"
TAINT_KEY = "ate.dev/kvm-unhealthy"
PROBER_SELECTOR = "app.kubernetes.io/name=ate-devplugin-kvm-prober"
PROBER_RESOURCE = f"{RESOURCE}-prober"
WORKLOADS = "kvm-dra"
RESOURCES = [{"name": RESOURCE, "devices": ["/dev/kvm"], "cdi": {"file_mode": "0666"}}]


@pytest.fixture(scope="module")
def release(cluster_137: Cluster, helm_137: Helm) -> Iterator[Cluster]:
    """The release in dra mode with the prober, each node watching its own device directory
    holding a node of the real KVM numbers; uninstalled at the end."""
    cluster = cluster_137
    for node in cluster.nodes:
        node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {KVM} c 10 232"])
    try:
        start = time.monotonic()
        helm_137.install(
            "--set", "dra.mode=dra", "--set", "dra.slots=2",
            "--set", f"hostPaths.dev={PRIVATE_DEV}", "--set-json", f"deviceConfig.resources={json.dumps(RESOURCES)}",
        )  # fmt: skip
        print(f"helm install (dra, prober) returned after {time.monotonic() - start:.1f}s")
        ensure_namespace(cluster, WORKLOADS, "restricted")
        yield cluster
    finally:
        cluster.kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", timeout=180)
        if helm_137.run("status", RELEASE, "-n", NAMESPACE, check=False).returncode == 0:
            helm_137.uninstall()
        wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        for node in cluster.nodes:
            node.run(["rm", "-rf", PRIVATE_DEV])


# --- what the cluster says --------------------------------------------------------------


def node_devices(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    """The devices of the node's ResourceSlices of the driver."""
    slices = cluster.get_json("resourceslices")["items"]
    return [
        d
        for s in slices
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == node.name
        for d in s["spec"].get("devices", [])
    ]


def probed(cluster: Cluster, node: Node) -> list[dict[str, Any]] | None:
    """The node's devices once each carries the probed attributes."""
    devices = node_devices(cluster, node)
    return devices if devices and all(kvm_probed(d) for d in devices) else None


def all_tainted(cluster: Cluster, node: Node) -> list[list[tuple[str, str, str]]] | None:
    """Each device's taints once every device of the node has one."""
    found = taints(cluster, node)
    return found if found and all(found) else None


def untainted(cluster: Cluster, node: Node) -> bool:
    found = taints(cluster, node)
    return bool(found) and all(t == [] for t in found or [])


def taints(cluster: Cluster, node: Node) -> list[list[tuple[str, str, str]]] | None:
    """Each device's (key, value, effect) taints; None while the node has no device."""
    devices = node_devices(cluster, node)
    if not devices:
        return None
    return [[(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints", [])] for d in devices]


def probe_state(cluster: Cluster, node: Node) -> dict[str, float]:
    (pod,) = plugin_pods(cluster, node)
    return kvm_probe_states(cluster, pod)


def probe_passed(cluster: Cluster, node: Node) -> bool:
    return probe_state(cluster, node)["passed"] == 1


def node_readyz(cluster: Cluster, node: Node) -> str:
    (pod,) = plugin_pods(cluster, node)
    return readyz(cluster, pod)


def probers(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    """The node's prober pods not being deleted."""
    pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", PROBER_SELECTOR)["items"]
    return [p for p in pods if p["spec"].get("nodeName") == node.name and not p["metadata"].get("deletionTimestamp")]


def running_prober(cluster: Cluster, node: Node) -> dict[str, Any] | None:
    pods = probers(cluster, node)
    return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" else None


def diagnose(cluster: Cluster, node: Node) -> str:
    """What the node's daemon and prober say, for a failure's message."""
    said = []
    for pod in plugin_pods(cluster, node):
        said.append("daemon log:\n" + cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"], "--tail", "20"))
    for pod in cluster.get_json("pods", "-n", NAMESPACE, "-l", PROBER_SELECTOR)["items"]:
        name = pod["metadata"]["name"]
        said.append(f"prober {name} on {pod['spec'].get('nodeName')}: {pod['status']}")
        said.append("its log:\n" + cluster.kubectl("logs", "-n", NAMESPACE, name, "--tail", "10", check=False))
    return "\n".join(said)


def unschedulable(cluster: Cluster, name: str) -> str:
    """The scheduler's message while the pod cannot be scheduled; "" otherwise."""
    pod = cluster.get_json("pod", "-n", WORKLOADS, name)
    for c in pod["status"].get("conditions", []):
        if (c["type"], c["status"], c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(c.get("message") or "")
    return ""


def phase(cluster: Cluster, name: str) -> str:
    return str(cluster.get_json("pod", "-n", WORKLOADS, name)["status"].get("phase", ""))


# --- what a user makes ------------------------------------------------------------------


def claim_and_pod(cluster: Cluster, name: str, selector: str | None, node: Node | None = None) -> str:
    """A ResourceClaim of kvm.ate.dev (with the CEL ``selector``) and a non-root pod without
    capabilities running ``ate-devplugin verify`` on the claim's /dev/kvm (a VM made, guest
    code run); on ``node`` when given (a nodeSelector: the scheduler still allocates). Returns
    the pod's name."""
    name = f"{name}-{uuid.uuid4().hex[:6]}"
    request: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    cluster.apply({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"devices": {"requests": [{"name": "kvm", "exactly": request}]}},
    })  # fmt: skip
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "resourceClaims": [{"name": "kvm", "resourceClaimName": name}],
            "containers": [{
                "name": "verify", "image": PLUGIN_IMAGE, "imagePullPolicy": "Never",
                "command": ["ate-devplugin"], "args": ["verify", "--device=/dev/kvm", "--timeout=10"],
                "resources": {"claims": [{"name": "kvm"}]},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    cluster.apply(pod)
    return name


def verified(cluster: Cluster, name: str, timeout: float = 120) -> str:
    """Waits until the pod ran to its end; asserts it succeeded (its VM ran); its log."""
    end = wait_until(f"{name} done", lambda: (p := phase(cluster, name)) in ("Succeeded", "Failed") and p, timeout)
    log = cluster.kubectl("logs", "-n", WORKLOADS, name, check=False)
    assert end == "Succeeded", f"{name} {end}:\n{log}"
    assert "PASS: a VM ran guest code on /dev/kvm" in log, log
    return log


def delete(cluster: Cluster, *names: str) -> None:
    for name in names:
        cluster.kubectl("delete", "pod,resourceclaim", "-n", WORKLOADS, name, "--ignore-not-found", "--wait=false")


# --- the checks -------------------------------------------------------------------------


def test_the_probers_hold_their_own_resource_and_their_probes_pass(release: Cluster) -> None:
    cluster = release
    print(f"Kubernetes {cluster.version()}, nodes {[n.name for n in cluster.nodes]}")
    for node in cluster.nodes:
        wait_plugin_ready(cluster, node)
        try:
            prober = wait_until(f"the prober running on {node.name}", partial(running_prober, cluster, node), 180)
            wait_until(f"{node.name}'s probe passed", partial(probe_passed, cluster, node), 120)
        except ClusterError:
            print(diagnose(cluster, node))
            raise
        spec = prober["spec"]
        (container,) = spec["containers"]
        # No claim: one unit of the prober's resource, which the DRA-mode daemon serves as a device plugin.
        assert "resourceClaims" not in spec
        assert container["resources"]["limits"][PROBER_RESOURCE] == "1"
        assert RESOURCE not in container["resources"]["limits"]
        assert node.resource("allocatable", PROBER_RESOURCE) == "4"
        assert spec["securityContext"]["runAsUser"] == 0
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["privileged"] is False
        states, said = probe_state(cluster, node), node_readyz(cluster, node)
        print(f"{node.name}: prober {prober['metadata']['name']} uid 0, one unit of {PROBER_RESOURCE}, "
              f"daemon states {states}, readyz {said!r}")  # fmt: skip


def cpuinfo_model(node: Node) -> int:
    text = node.run(["cat", "/proc/cpuinfo"]).stdout
    return int(next(line.split(":")[1] for line in text.splitlines() if line.startswith("model\t")))


def test_the_slice_devices_carry_the_kvm_attributes(release: Cluster) -> None:
    cluster = release
    for node in cluster.nodes:
        devices = wait_until(f"{node.name}'s devices with the probed attributes", partial(probed, cluster, node), 60)
        for device in devices:
            attrs = attributes(device)
            assert attrs["resource"] == RESOURCE
            assert attrs["kvmImplementation"] == "pvm", attrs
            assert attrs["kvmHardware"] is False
            assert attrs["kvmApiVersion"] == 12
            assert attrs["cpuModel"] == cpuinfo_model(node)
            assert len(attrs["cpuidDigest"]) == 32
            assert int(attrs["cpuidDigest"], 16) >= 0
            assert "taints" not in device
        print(f"{node.name}: {len(devices)} devices ({[d['name'] for d in devices]}), "
              f"{len(devices[0]['attributes'])} attributes each: {attributes(devices[0])}")  # fmt: skip


def test_the_cpu_model_selector_example(release: Cluster) -> None:
    """docs/kvm-health.md, "As DRA attributes": a claim for this machine's model schedules and
    its VM runs; one for another model and one for hardware KVM stay Pending, said why."""
    cluster = release
    (device, *_) = node_devices(cluster, cluster.node)
    model = attributes(device)["cpuModel"]
    vendor = attributes(device)["cpuVendor"]
    attr = 'device.attributes["ate.dev"]'
    match = claim_and_pod(cluster, "model-match", f'{attr}.cpuModel == {model} && {attr}.cpuVendor == "{vendor}"')
    other = claim_and_pod(cluster, "model-other", f"{attr}.cpuModel == {model + 1}")
    hardware = claim_and_pod(cluster, "hardware", f"{attr}.kvmHardware == true")
    try:
        start = time.monotonic()
        log = verified(cluster, match)
        print(f"cpuModel == {model} && cpuVendor == {vendor!r}: Succeeded after {time.monotonic() - start:.1f}s, "
              f"its last line {log.strip().splitlines()[-1]!r}")  # fmt: skip
        for name, what in ((other, f"cpuModel == {model + 1}"), (hardware, "kvmHardware == true")):
            message = wait_until(f"{name} unschedulable", partial(unschedulable, cluster, name), 60)
            assert "cannot allocate all claims" in message, message
            assert phase(cluster, name) == "Pending"
            claim = cluster.get_json("resourceclaim", "-n", WORKLOADS, name)
            assert "allocation" not in claim.get("status", {})
            print(f"{what}: Pending, PodScheduled False Unschedulable: {message!r}")
    finally:
        delete(cluster, match, other, hardware)


def test_a_1_3_node_taints_the_devices_and_the_real_node_back_clears_them(release: Cluster) -> None:
    cluster = release
    node, other_node = cluster.nodes
    assert untainted(cluster, node)
    # A 1:3 node renamed over the node's kvm: the daemon's own 10:232 check, then the taint.
    start = time.monotonic()
    node.run(["sh", "-ec", f"mv {KVM} {KVM}.real; mknod -m 0600 {KVM}.new c 1 3; mv {KVM}.new {KVM}"])
    tainted = wait_until("every device of the node tainted", partial(all_tainted, cluster, node), 60, interval=0.2)
    to_taint = time.monotonic() - start
    assert all(t == [(TAINT_KEY, "not-a-kvm-device", "NoSchedule")] for t in tainted), tainted
    assert untainted(cluster, other_node)  # the other node's are not
    said = node_readyz(cluster, node)
    assert "KVM probe failed: not-a-kvm-device:" in said, said
    print(f"1:3 node: {len(tainted)} devices tainted {tainted[0]} {to_taint:.1f}s after the rename; readyz {said!r}")

    # A new claim on that node is not allocated: its pod stays Pending, said why.
    pending = claim_and_pod(cluster, "while-tainted", None, node=node)
    try:
        message = wait_until("the pod unschedulable", lambda: unschedulable(cluster, pending), 60)
        assert "cannot allocate all claims" in message, message
        print(f"a new claim's pod on {node.name}: Pending, {message!r}")

        # A prober pod made now (a rollout, an eviction) is still admitted: its resource is not the tainted one.
        (old,) = probers(cluster, node)
        start = time.monotonic()
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=true", timeout=60)
        try:
            prober = wait_until("a new prober running", lambda: running_prober(cluster, node), 120)
        except ClusterError:
            print(diagnose(cluster, node))
            raise
        assert all_tainted(cluster, node)  # admitted while the node's devices are tainted
        print(f"new prober {prober['metadata']['name']}: Running {time.monotonic() - start:.1f}s after the old one's "
              f"deletion began, while the node's devices are tainted")  # fmt: skip

        # The real node back: the prober's probe passes (its container restarted onto the
        # current node), the taint goes, and the pending pod is allocated and runs its VM.
        start = time.monotonic()
        node.run(["mv", f"{KVM}.real", KVM])
        try:
            wait_until("the taint gone", partial(untainted, cluster, node), 90, interval=0.2)
        except ClusterError:
            print(diagnose(cluster, node))
            raise
        to_clear = time.monotonic() - start
        # The 1:3 node's verdict goes with it (no taint without a verdict); the prober's next
        # report on the real node passes.
        wait_until("the probe passed on the real node", partial(probe_passed, cluster, node), 60)
        to_passed = time.monotonic() - start
        states = probe_state(cluster, node)
        wait_until(
            "the pending pod scheduled",
            lambda: cluster.get_json("pod", "-n", WORKLOADS, pending)["spec"].get("nodeName"),
            60,
        )
        to_scheduled = time.monotonic() - start
        log = verified(cluster, pending)
        to_run = time.monotonic() - start
        print(f"real node back: taint gone after {to_clear:.1f}s, the probe passed after {to_passed:.1f}s "
              f"(daemon states {states}); the pending pod scheduled after {to_scheduled:.1f}s, "
              f"Succeeded after {to_run:.1f}s: {log.strip().splitlines()[-1]!r}")  # fmt: skip
    finally:
        delete(cluster, pending)


def test_uninstall_stops_the_probers_first_and_leaves_nothing(release: Cluster, helm_137: Helm) -> None:
    """The pre-delete hook deletes the probers before the drivers (the drivers serve the units
    they hold); then the drivers delete their slices."""
    cluster = release
    cluster.kubectl("delete", "namespace", WORKLOADS, "--wait=true", timeout=180)
    start = time.monotonic()
    out = helm_137.uninstall()
    took = time.monotonic() - start
    pods = wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 60)
    gone = time.monotonic() - start
    assert pods
    assert not cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    assert not [s for s in cluster.get_json("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    print(f"helm uninstall returned after {took:.1f}s, every pod gone after {gone:.1f}s; {out.stdout.strip()!r}")
