"""kube-state-metrics, the real one (tools/build-kube-state-metrics.sh), reading a real API
server (tests/harness/apiserver.py), and the objects it reads there.

The API server runs no controller and no kubelet, so :class:`PluginPods` plays their parts
as the apiserver harness does for the DRA driver: it writes the chart's DaemonSet and its
pods with the status the DaemonSet controller and each node's kubelet would give them
(running and ready, or Pending, its host path not mounted, after a broken rollout). What
kube-state-metrics makes of those objects, and the queries and alerts that read its series,
are the real thing. tests/e2e runs the same against a real cluster, whose controllers and
kubelet write the statuses themselves.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.harness import apiserver
from tests.harness.apiserver import ADMIN, ApiServer
from tests.harness.net import free_port, http_get
from tests.harness.process import stop_process
from tests.harness.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
INSTALL = "tools/build-kube-state-metrics.sh"
# What the dashboards and the alert read: a DaemonSet's status and its pods.
RESOURCES = "daemonsets,pods"
NAMESPACE = "ate-system"
DAEMONSET = "ate-devplugin"  # the default release's DaemonSet: the dashboards' and alerts' default
IMAGE = "ghcr.io/ate-dev/ate-devplugin:0.1.0"
LABELS = {"app.kubernetes.io/name": "ate-devplugin", "app.kubernetes.io/instance": "ate-devplugin"}


def binary() -> Path | None:
    """The built kube-state-metrics: ``$KUBE_STATE_METRICS`` or build/bin's."""
    path = Path(os.environ.get("KUBE_STATE_METRICS", REPO / "build" / "bin" / "kube-state-metrics"))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing() -> str | None:
    """Why kube-state-metrics and its API server cannot run here (None: they can)."""
    if binary() is None:
        return f"kube-state-metrics not built: run {INSTALL}"
    return apiserver.missing()


class KubeStateMetrics:
    """The process, on loopback, reading ``kubeconfig``'s API server; a context manager."""

    def __init__(self, kubeconfig: Path, log_dir: Path, resources: str = RESOURCES) -> None:
        found = binary()
        if found is None:
            raise RuntimeError(f"kube-state-metrics not built: {INSTALL}")
        self.port, self.telemetry_port = free_port(), free_port()
        self.argv = [
            str(found), f"--kubeconfig={kubeconfig}", f"--resources={resources}",
            "--host=127.0.0.1", f"--port={self.port}",
            "--telemetry-host=127.0.0.1", f"--telemetry-port={self.telemetry_port}",
        ]  # fmt: skip
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "kube-state-metrics.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._serving, 60, lambda: f"kube-state-metrics /metrics; log:\n{self.log_tail()}", 0.2)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _serving(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"kube-state-metrics exited:\n{self.log_tail()}")
        with contextlib.suppress(OSError):
            return http_get(f"http://{self.address}/metrics", timeout=5)[0] == 200
        return False

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc, timeout=15)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


def scrape_config(address: str) -> dict[str, Any]:
    """Its scrape job as kube-prometheus-stack has it: honor_labels, so that namespace, pod and
    node are the objects' and not kube-state-metrics' own."""
    return {"job_name": "kube-state-metrics", "honor_labels": True, "static_configs": [{"targets": [address]}]}


# --- the objects, as the DaemonSet controller and the kubelets would write them ----------


@dataclass
class PluginPods:
    """The chart's DaemonSet in ``api`` and one pod of it per node."""

    api: ApiServer
    nodes: tuple[str, ...]
    namespace: str = NAMESPACE
    name: str = DAEMONSET

    def create(self) -> None:
        """The namespace, the DaemonSet, and a running, ready pod on every node, named as the
        scrape targets name them (``<daemonset>-<node>``)."""
        self.api.create_namespace(self.namespace)
        # The ServiceAccount admission wants it; the controller that makes it is not running.
        self.api.must("POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts", {"metadata": {"name": "default"}})
        ds = self.api.must("POST", f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets", {
            "metadata": {"name": self.name, "labels": LABELS},
            "spec": {"selector": {"matchLabels": LABELS},
                     "template": {"metadata": {"labels": LABELS}, "spec": _pod_spec()}},
        })  # fmt: skip
        self.uid = str(ds["metadata"]["uid"])
        for node in self.nodes:
            self.start_pod(f"{self.name}-{node}", node, running=True)
        self.set_status(ready=len(self.nodes))

    def start_pod(self, pod: str, node: str, *, running: bool) -> None:
        """A pod of the DaemonSet bound to ``node``: running and ready, or Pending with its
        volumes not mounted (a rollout to a host path the node does not have), so with no IP:
        no endpoint, no scrape target. (A pod whose image cannot be pulled has its IP: a target
        that is down, which AteDevpluginDown covers.)"""
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": self.name, "uid": self.uid,
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        created = self.api.must("POST", base, {
            "metadata": {"name": pod, "labels": LABELS, "ownerReferences": [owner]},
            "spec": {**_pod_spec(), "nodeName": node},
        })  # fmt: skip
        created["status"] = _pod_status(running)
        self.api.must("PUT", f"{base}/{pod}/status", created)

    def delete_pod(self, pod: str) -> None:
        self.api.must("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{pod}", {"gracePeriodSeconds": 0})

    def set_status(self, ready: int) -> None:
        """The DaemonSet's status: a pod on every node, ``ready`` of them ready."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.name}"
        ds = self.api.must("GET", path)
        desired = len(self.nodes)
        ds["status"] = {
            "desiredNumberScheduled": desired, "currentNumberScheduled": desired, "updatedNumberScheduled": desired,
            "numberMisscheduled": 0, "numberReady": ready, "numberAvailable": ready,
            "numberUnavailable": desired - ready, "observedGeneration": ds["metadata"]["generation"],
        }  # fmt: skip
        self.api.must("PUT", f"{path}/status", ds)


def _pod_spec() -> dict[str, Any]:
    return {"containers": [{"name": "ate-devplugin", "image": IMAGE}], "automountServiceAccountToken": False}


def _pod_status(running: bool) -> dict[str, Any]:
    now = "2026-01-01T00:00:00Z"
    ready = "True" if running else "False"
    state: Mapping[str, Any] = (
        {"running": {"startedAt": now}} if running else {"waiting": {"reason": "ContainerCreating"}}
    )
    return {
        "phase": "Running" if running else "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {"name": "ate-devplugin", "image": IMAGE, "imageID": "", "ready": running, "restartCount": 0,
             "started": running, "state": state},
        ],
        "hostIP": "127.0.0.1",
        **({"podIP": "127.0.0.1"} if running else {}),
        "startTime": now,
    }  # fmt: skip


@contextlib.contextmanager
def cluster_state(work: Path, nodes: tuple[str, ...]) -> Iterator[tuple[PluginPods, KubeStateMetrics]]:
    """An API server holding the plugin pods of ``nodes``, and kube-state-metrics reading it."""
    with ApiServer(work / "apiserver") as api:
        pods = PluginPods(api, nodes)
        pods.create()
        with KubeStateMetrics(api.kubeconfig(ADMIN), work / "kube-state-metrics") as ksm:
            yield pods, ksm
