"""What a user does and looks at on the node: helm, the plugin pod, its metrics, and pods
that ask for a device: docs/examples/kvm-consumer-pod.yaml, the device-only demo, as
shipped, and docs/examples/microvm-worker-pod.yaml, QEMU booting a guest with a NIC
(tests/e2e/vmm.py); both with the suite's VMM image."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import Cluster, ClusterError, Node, wait_until
from tests.e2e.images import PLUGIN_IMAGE
from tests.e2e.vmm import VMM_IMAGE, QemuRun, worker_pod
from tests.harness.chart import helm_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
EXAMPLE_POD = REPO / "docs" / "examples" / "kvm-consumer-pod.yaml"
NAMESPACE = "ate-system"
RELEASE = "ate-devplugin"
RESOURCE = "ate.dev/kvm"
PLUGIN_SELECTOR = "app.kubernetes.io/name=ate-devplugin"
METRICS_PORT = 9477
WORKLOADS = "vm-workers"  # the example's namespace
MICROVM_WORKERS = "microvm-workers"  # the worker example's namespace
TUN = "ate.dev/tun"
IMAGE_VALUES = ("--set", "image.repository=localhost/ate-devplugin", "--set", f"image.tag={PLUGIN_IMAGE.split(':')[1]}",
                "--set", "image.pullPolicy=Never")  # fmt: skip


@dataclass
class Helm:
    """A real helm CLI (v3 or v4) run inside the sandbox against the cluster.

    ``chart`` is what install and upgrade name (default the checkout's chart, with the
    image preloaded on the node: ``image_values``); the user path names the published
    chart and no image values. ``env`` is added to helm's (a registry's CA)."""

    major: str
    path: Path
    cluster: Cluster
    chart: tuple[str, ...] = (str(CHART),)
    image_values: tuple[str, ...] = IMAGE_VALUES
    env: dict[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        home = self.cluster.dir / f"helm-{self.major}"
        return {**self.cluster.env, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
                "HELM_DATA_HOME": f"{home}/data", **self.env}  # fmt: skip

    def run(self, *args: str, check: bool = True, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        return self.cluster.sandbox.run([str(self.path), *args], env=self.environment(), check=check, timeout=timeout)

    def shell(self, script: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``script`` as a user types it (sh -e), in ``cwd``, with this helm as ``helm`` and the
        cluster's kubectl as ``kubectl`` on PATH."""
        bin_dir = cwd / f".helm-{self.major}-bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "helm"
        link.unlink(missing_ok=True)
        link.symlink_to(self.path)
        env = self.environment()
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
        return self.cluster.sandbox.run(["sh", "-ec", f"cd {cwd}\n{script}"], env=env, timeout=timeout)

    def install(self, *values: str) -> subprocess.CompletedProcess[str]:
        return self.run("install", RELEASE, *self.chart, "--namespace", NAMESPACE, "--create-namespace",
                        *self.image_values, *values, "--wait", "--timeout", "5m")  # fmt: skip

    def upgrade(self, *values: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The chart's defaults plus ``values``: given none, helm would reuse the last release's."""
        return self.run("upgrade", RELEASE, *self.chart, "--namespace", NAMESPACE, "--reset-values",
                        *self.image_values, *values, "--wait", "--timeout", "5m", check=check)  # fmt: skip

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        return self.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "2m")


def make_helm(major: str, cluster: Cluster) -> Helm:
    """helm ``major`` (v3, v4) as tools/build-helm.sh built it, run against ``cluster``."""
    path = helm_path(major)
    assert path is not None, f"helm {major} not built"
    return Helm(major, path, cluster)


TEST_SELECTOR = "app.kubernetes.io/component=test"  # the chart's helm test objects


def helm_test_passed(cluster: Cluster, out: str) -> list[dict[str, Any]]:
    """The chart's `helm test --logs` output ``out``: every test pod succeeded and its log is
    `ate-devplugin verify`'s report of a VM that ran guest code on API version 12, its process
    with no capability (the report's own line), the pods with no privilege escalation. Prints
    the pods' user, capabilities, node and each report; returns the pods."""
    names = re.findall(r"^POD LOGS: (\S+)$", out, flags=re.MULTILINE)  # this run's pods
    assert names, out
    pods = [cluster.get_json("pod", "-n", NAMESPACE, name) for name in names]
    assert [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods] == ["test"] * len(pods), names
    phases = re.findall(r"^Phase:\s+(\S+)$", out, flags=re.MULTILINE)  # one per test hook: the pods
    assert phases == ["Succeeded"] * len(pods), out
    reports = re.findall(
        r"^ate-devplugin verify (\S+)\n(.*?)^(PASS|FAIL)([^\n]*)$", out, flags=re.MULTILINE | re.DOTALL
    )
    assert len(reports) == len(pods), out
    user = pods[0]["spec"]["securityContext"].get("runAsUser")
    for device, body, verdict, rest in reports:
        assert verdict == "PASS", f"{verdict}{rest}"
        assert "  KVM API version: 12\n" in body, body
        assert re.search(rf"^  process: +uid {user}, .*; no capabilities$", body, flags=re.MULTILINE), body
        assert "hlt (expected out 0x3f8 '4', out 0x3f8 '\\n', hlt)" in body, body
        assert re.fullmatch(rf": a VM ran guest code on {re.escape(device)} in [0-9.]+ ms", rest), rest
    for pod in pods:
        spec = pod["spec"]
        (container,) = spec["containers"]
        (status,) = pod["status"]["containerStatuses"]
        assert (pod["status"]["phase"], status["state"]["terminated"]["exitCode"]) == ("Succeeded", 0)
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        user = spec["securityContext"]["runAsUser"]
        print(
            f"helm test pod {pod['metadata']['name']} on {spec['nodeName']}: uid {user}, "
            f"capabilities drop ALL, resources {container['resources']}, exit 0"
        )
    return pods


def plugin_pods(cluster: Cluster, node: Node | None = None) -> list[dict[str, Any]]:
    """The plugin pods not being deleted, of every node or of ``node``."""
    pods: list[dict[str, Any]] = cluster.get_json("pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and (node is None or p["spec"].get("nodeName") == node.name)
    ]


def is_ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def wait_plugin_ready(cluster: Cluster, node: Node | None = None, timeout: float = 240) -> dict[str, Any]:
    """What the chart's NOTES say to wait on: the DaemonSet rolled out; returns the Ready
    plugin pod of ``node`` (default: the first node)."""
    node = node or cluster.node
    cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"daemonset/{RELEASE}", f"--timeout={timeout:.0f}s",
                    timeout=timeout + 30)  # fmt: skip
    pod: dict[str, Any] = wait_until(
        f"one Ready plugin pod on {node.name}",
        lambda: next((p for p in plugin_pods(cluster, node) if is_ready(p)), None),
        60,
    )
    return pod


def resource_health(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """``containerStatuses[0].allocatedResourcesStatus`` of a pod (KEP-4680: the kubelet writes
    device health there on 1.36+), as kubectl get pod -o yaml shows it."""
    pod = cluster.get_json("pod", "-n", namespace, name)
    statuses = pod["status"].get("containerStatuses") or [{}]
    found: list[dict[str, Any]] = statuses[0].get("allocatedResourcesStatus") or []
    return found


def unhealthy_in_status(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]] | None:
    """The pod's devices its status says are Unhealthy, or None."""
    found = [
        r for s in resource_health(cluster, namespace, name)
        for r in s.get("resources", []) if r.get("health") == "Unhealthy"
    ]  # fmt: skip
    return found or None


def metrics(cluster: Cluster, pod: dict[str, Any]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The plugin pod's /metrics, fetched from inside the sandbox: {(sample, labels): value}."""
    status, text = cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics")
    if status != 200:
        raise ClusterError(f"/metrics answered {status}")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    """The one sample ``name`` whose labels include ``labels``; None when there is none."""
    found = [v for (n, ls), v in values.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def attributes(device: dict[str, Any]) -> dict[str, Any]:
    """{name: value} of a ResourceSlice device's attributes, without their types."""
    return {name: next(iter(typed.values())) for name, typed in device.get("attributes", {}).items()}


def kvm_probed(device: dict[str, Any]) -> bool:
    """Whether a KVM device carries the probe's attributes (the prober is on by default)."""
    return "kvmApiVersion" in attributes(device)


def readyz(cluster: Cluster, pod: dict[str, Any]) -> str:
    """The daemon pod's /readyz text (200: readiness never waits for the KVM probe)."""
    status, body = cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:9477/readyz")
    assert status == 200, body
    return str(body)


def kvm_probe_states(cluster: Cluster, pod: dict[str, Any]) -> dict[str, float]:
    """``ate_devplugin_kvm_probe_state`` of the daemon pod's KVM resource: {state: 0 or 1}."""
    values = metrics(cluster, pod)
    return {
        s: sample(values, "ate_devplugin_kvm_probe_state", resource_name=RESOURCE, state=s) or 0.0
        for s in ("unverified", "passed", "failed", "cannot-probe", "prober-gone")
    }


def example_pod(
    name: str, *, request: bool = True, supplemental_groups: tuple[int, ...] = (), node: Node | None = None
) -> dict[str, Any]:
    """docs/examples/kvm-consumer-pod.yaml as shipped (non-root, no capabilities, no
    privilege escalation, its own check of /dev/kvm), with the VMM image (it has sh, test
    and ls as busybox has); on ``node`` when given (a nodeSelector: the scheduler still
    decides it fits)."""
    pod: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE_POD.read_text()))
    pod["metadata"]["name"] = name
    container = pod["spec"]["containers"][0]
    container.update(image=VMM_IMAGE, imagePullPolicy="Never")
    if not request:
        del container["resources"]["limits"][RESOURCE]
    if supplemental_groups:
        pod["spec"]["securityContext"]["supplementalGroups"] = list(supplemental_groups)
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    return pod


def worker(name: str, *, kvm: bool = True, node: Node | None = None, hold: bool = False) -> dict[str, Any]:
    """docs/examples/microvm-worker-pod.yaml with the VMM image (tests/e2e/vmm.py)."""
    return worker_pod(name, kvm=kvm, node=node.name if node else None, hold=hold)


#: A claim for the worker's two devices, from the chart's DeviceClasses (dra.mode dra).
CLAIM_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "microvm", "namespace": MICROVM_WORKERS},
    "spec": {"spec": {"devices": {"requests": [
        {"name": "kvm", "exactly": {"deviceClassName": "kvm.ate.dev"}},
        {"name": "tun", "exactly": {"deviceClassName": "tun.ate.dev"}},
    ]}}},
}  # fmt: skip


def claiming(pod: dict[str, Any]) -> dict[str, Any]:
    """The worker asking through a claim from :data:`CLAIM_TEMPLATE` instead of its extended
    resources: the init container gets the claim's tun request, QEMU the whole claim."""
    pod = copy.deepcopy(pod)
    pod["spec"]["resourceClaims"] = [{"name": "vm", "resourceClaimTemplateName": "microvm"}]
    (init,) = pod["spec"]["initContainers"]
    (vmm,) = pod["spec"]["containers"]
    for container, claim in ((init, {"name": "vm", "request": "tun"}), (vmm, {"name": "vm"})):
        limits = container["resources"]["limits"]
        for resource in (RESOURCE, TUN):
            limits.pop(resource, None)
        container["resources"]["claims"] = [claim]
    return pod


def ensure_namespace(cluster: Cluster, name: str, level: str) -> None:
    """A namespace enforcing the Pod Security Standard ``level``."""
    cluster.apply({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
    })  # fmt: skip
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_until(f"{name}'s ServiceAccount", lambda: cluster.get_json("sa", "-n", name, "default"), 60)


def ensure_workload_namespace(cluster: Cluster) -> None:
    """The device-only example's namespace, enforcing the restricted Pod Security Standard,
    and the worker example's, which admits the init container's NET_ADMIN (outside the
    baseline standard) and so enforces none."""
    ensure_namespace(cluster, WORKLOADS, "restricted")
    ensure_namespace(cluster, MICROVM_WORKERS, "privileged")


def run_pod(cluster: Cluster, pod: dict[str, Any], timeout: float = 180) -> QemuRun:
    """Create the pod under a fresh name, wait until it ran to completion; what its (first)
    container printed, its exit code and the pod's phase."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] += "-" + uuid.uuid4().hex[:6]
    ensure_workload_namespace(cluster)
    cluster.apply(pod)
    try:
        return finished(cluster, pod, timeout)
    finally:
        cluster.kubectl("delete", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "--wait=false",
                        check=False)  # fmt: skip


def finished(cluster: Cluster, pod: dict[str, Any], timeout: float = 180) -> QemuRun:
    """Wait until ``pod`` (made already) ran to completion; what its first container printed,
    its exit code and the pod's phase. Describes the pod when it does not finish in time."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    container = pod["spec"]["containers"][0]["name"]
    try:
        wait_until(
            f"pod {name} to finish",
            lambda: cluster.get_json("pod", "-n", namespace, name)["status"].get("phase") in ("Succeeded", "Failed"),
            timeout,
        )
    except ClusterError:
        print(cluster.kubectl("describe", "pod", "-n", namespace, name, check=False))
        raise
    got = cluster.get_json("pod", "-n", namespace, name)
    (status,) = [s for s in got["status"]["containerStatuses"] if s["name"] == container]
    terminated = status["state"].get("terminated", {})
    logs = cluster.kubectl("logs", "-n", namespace, name, "-c", container, check=False)
    return QemuRun(logs, terminated.get("exitCode"), got["status"]["phase"], got["spec"].get("nodeName", ""))


def booted_as_shipped(run: QemuRun, cgroup: int) -> None:
    """The worker's QEMU booted its guest as the example ships it: uid
    10001, no effective capability, no privilege escalation, on a node of cgroup version
    ``cgroup``."""
    facts = run.facts()
    print(f"QEMU worker: {run.summary()}")
    assert run.booted(), run.logs
    assert (facts["uid"], facts["CapEff"], facts["NoNewPrivs"]) == ("10001", "0000000000000000", "1"), facts
    assert facts["cgroup"] == ("cgroup2fs" if cgroup == 2 else "tmpfs"), facts


def kvm_rule(devices_list: list[str]) -> list[str]:
    """The device cgroup rules for /dev/kvm (char 10:232) in a devices.list."""
    return [line for line in devices_list if line.startswith("c 10:232 ")]


@contextlib.contextmanager
def watching(cluster: Cluster, *what: str) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """``kubectl get <what> --watch`` while the block runs: yields a function that returns
    every event seen so far (``{"type": ..., "object": ...}``), the initial list included."""
    watcher = cluster.sandbox.spawn(
        f"watch-{what[0]}-{uuid.uuid4().hex[:4]}",  # a log file's name: no selector in it
        [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "get", *what,
         "--watch", "--output-watch-events", "-o", "json"],
    )  # fmt: skip

    def events() -> list[dict[str, Any]]:
        decoder, text, pos, found = json.JSONDecoder(), watcher.log_tail(10**7), 0, []
        while (pos := text.find("{", pos)) >= 0:
            try:
                event, pos = decoder.raw_decode(text, pos)
            except ValueError:  # not an event (a warning on stderr)
                pos += 1
                continue
            found.append(event)
        return found

    try:
        # The watch first lists what is there: wait for that before the block acts.
        wait_until("the watch to start", lambda: '"ADDED"' in watcher.log_tail(10**7), 30)
        yield events
    finally:
        watcher.stop()
        cluster.sandbox.processes.remove(watcher)


def watch_exit_code(cluster: Cluster, pod_name: str, timeout: float = 120) -> tuple[int | None, float]:
    """Delete ``pod_name`` (plugin namespace), watching it: the exit code its container's
    last status reported before the pod object went away, and how long deletion took."""
    with watching(cluster, "pod", "-n", NAMESPACE, pod_name) as events:
        start = time.monotonic()
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod_name, "--wait=true", timeout=timeout)
        took = time.monotonic() - start
        wait_until("the DELETED event", lambda: any(e["type"] == "DELETED" for e in events()), 30)
        seen = events()
    code = None
    for event in seen:
        for status in event["object"].get("status", {}).get("containerStatuses", []):
            terminated = status.get("state", {}).get("terminated")
            if terminated:
                code = terminated["exitCode"]
    return code, took
