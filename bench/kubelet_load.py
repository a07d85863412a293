"""A real kubelet as the fleet bench's reference: its own API load per node.

The kubelet from tools/build-k8s.sh (of the control plane's release, ``bin_dir()``) runs in the fleet's sandbox
against the same API server, with Debian's containerd as its runtime, as node
``kubelet-ref`` with a node identity (``system:node:kubelet-ref``, group
``system:nodes``: the Node authorizer and NodeRestriction apply as on any node). It runs
no pods and has no pod network (the node stays NotReady): what it sends is a node's
steady load, lease renewals, node status and its watches, which the audit log counts
like our daemons' requests. No pod cgroups (``cgroupsPerQOS: false``), nothing outside
the sandbox's tmpfs: its root dir, containerd's root and state are under ``/var/lib``
and ``/run`` of the sandbox.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from bench.controlplane import ADVERTISE_IP, ControlPlane, bin_dir
from tests.e2e.sandbox import Process

NODE = "kubelet-ref"
USER = f"system:node:{NODE}"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"


def missing() -> str | None:
    if not (bin_dir() / "kubelet").is_file():
        return f"no {bin_dir() / 'kubelet'} (tools/build-k8s.sh)"
    if shutil.which("containerd") is None:
        return "no containerd on PATH (Debian containerd)"
    return None


class RealKubelet:
    def __init__(self, cp: ControlPlane, work: Path) -> None:
        self.cp = cp
        self.dir = work / "kubelet-ref"
        self.containerd: Process | None = None
        self.kubelet: Process | None = None

    @staticmethod
    def prepare(cp: ControlPlane) -> None:
        """Its identity: before the API server starts."""
        cp.add_user(USER, "system:nodes")

    def start(self, timeout: float = 120.0) -> float:
        """Starts containerd and the kubelet; returns once its Node and Lease exist (time.time())."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "containerd.toml"
        config.write_text(f"""version = 2
root = "/var/lib/kubelet-ref-containerd"
state = "/run/containerd/state"
[grpc]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")
        self.containerd = self.cp.sandbox.spawn("kubelet-ref-containerd", ["containerd", "--config", str(config)])
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        }
        path = self.dir / "kubelet.json"
        path.write_text(json.dumps(kubelet_config))
        self.kubelet = self.cp.sandbox.spawn("kubelet-ref", [
            str(bin_dir() / "kubelet"), f"--config={path}", f"--kubeconfig={self.cp.kubeconfig(USER)}",
            f"--hostname-override={NODE}", f"--node-ip={ADVERTISE_IP}", "--v=1",
        ])  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in (self.containerd, self.kubelet):
                if not proc.running():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
            node = self.cp.request("GET", f"/api/v1/nodes/{NODE}")[0]
            lease = self.cp.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}")[0]
            if node == 200 and lease == 200:
                return time.time()
            time.sleep(1.0)
        assert self.kubelet is not None
        raise RuntimeError(f"kubelet-ref: no Node and Lease after {timeout:.0f}s:\n{self.kubelet.log_tail()}")

    def stop(self) -> None:
        for proc in (self.kubelet, self.containerd):
            if proc is not None:
                proc.stop(timeout=20)
