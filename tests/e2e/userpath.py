"""What a user does and looks at on the node: helm, the plugin pod, its metrics, and pods
that ask for a device (built from docs/examples/kvm-consumer-pod.yaml)."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e import microvm
from tests.e2e.cluster import Cluster, ClusterError, Node, wait_until
from tests.e2e.images import PLUGIN_IMAGE
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
KVM_API_VERSION = 12  # what KVM_GET_API_VERSION has returned since Linux 2.6.22
IMAGE_VALUES = ("--set", "image.repository=localhost/ate-devplugin", "--set", f"image.tag={PLUGIN_IMAGE.split(':')[1]}",
                "--set", "image.pullPolicy=Never")  # fmt: skip

MICRO_VM = Path(microvm.__file__).read_text()
# Run in the consumer container: what a VM worker needs from /dev/kvm, as JSON, ending with
# the micro-VM's run (tests/e2e/microvm.py).
CHECK_KVM = (
    MICRO_VM
    + r"""
import fcntl, json, os, stat
r = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
r["cap_eff"], r["no_new_privs"] = status["CapEff"].strip(), status["NoNewPrivs"].strip()
try:
    st = os.stat("/dev/kvm")
    r["node"] = [stat.filemode(st.st_mode), st.st_uid, st.st_gid, os.major(st.st_rdev), os.minor(st.st_rdev)]
except OSError as e:
    r["node"] = f"{type(e).__name__}: {e}"
try:
    fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    r["api_version"] = fcntl.ioctl(fd, 0xAE00)  # KVM_GET_API_VERSION
    os.close(fd)
except OSError as e:
    r["error"] = f"{type(e).__name__}: {e}"
try:
    r["vm"] = run_vm()
except OSError as e:
    r["vm_error"] = f"{type(e).__name__}: {e}"
try:
    r["devices_list"] = open("/sys/fs/cgroup/devices/devices.list").read().splitlines()
except OSError as e:
    r["devices_list"] = str(e)
print(json.dumps(r))
"""
)
# The micro-VM's report, then hold it (and /dev/kvm) until the pod is deleted.
HOLD_VM = (
    MICRO_VM
    + r"""
import json, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1 of its container: no default action
report = {"uid": os.getuid()}
try:
    report["vm"] = run_vm()
except OSError as exc:
    report["vm_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(report), flush=True)
while True:
    time.sleep(3600)
"""
)


def ran_vm(result: dict[str, Any]) -> bool:
    """The pod's micro-VM ran, as uid 10001: its guest wrote 2+2 to the serial port and halted."""
    vm = result.get("vm") or {}
    return (result.get("uid"), vm.get("api_version"), vm.get("serial"), (vm.get("exits") or [[]])[-1]) == (
        10001, KVM_API_VERSION, "4\n", ["hlt"],
    )  # fmt: skip


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


def consumer_pod(
    name: str, *, request: bool = True, supplemental_groups: tuple[int, ...] = (), node: Node | None = None
) -> dict[str, Any]:
    """The example pod as shipped (non-root, no capabilities, no privilege escalation), with
    the project image (it has python3) running :data:`CHECK_KVM` instead of busybox; on
    ``node`` when given (a nodeSelector: the scheduler still decides it fits)."""
    pod: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE_POD.read_text()))
    pod["metadata"]["name"] = name
    container = pod["spec"]["containers"][0]
    container.update(image=PLUGIN_IMAGE, imagePullPolicy="Never", command=["python3", "-c", CHECK_KVM])
    if not request:
        del container["resources"]["limits"][RESOURCE]
    if supplemental_groups:
        pod["spec"]["securityContext"]["supplementalGroups"] = list(supplemental_groups)
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    return pod


def ensure_workload_namespace(cluster: Cluster) -> None:
    """The example's namespace, enforcing the restricted Pod Security Standard."""
    cluster.apply({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": WORKLOADS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    })  # fmt: skip
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_until("the namespace's ServiceAccount", lambda: cluster.get_json("sa", "-n", WORKLOADS, "default"), 60)


def run_consumer(cluster: Cluster, pod: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    """Create the pod, wait until it ran to completion, return what it printed (and phase)."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] += "-" + uuid.uuid4().hex[:6]
    name = pod["metadata"]["name"]
    ensure_workload_namespace(cluster)
    cluster.apply(pod)
    try:
        phase = wait_until(
            f"pod {name} to finish",
            lambda: (
                cluster.get_json("pod", "-n", WORKLOADS, name)["status"].get("phase") in ("Succeeded", "Failed")
                and cluster.get_json("pod", "-n", WORKLOADS, name)["status"]["phase"]
            ),
            timeout,
        )
        logs = cluster.kubectl("logs", "-n", WORKLOADS, name)
        result: dict[str, Any] = json.loads(logs.splitlines()[-1])
        result["phase"] = phase
        return result
    except ClusterError:
        print(cluster.kubectl("describe", "pod", "-n", WORKLOADS, name, check=False))
        raise
    finally:
        cluster.kubectl("delete", "pod", "-n", WORKLOADS, name, "--wait=false", check=False)


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
