"""A real API server for the DRA benches: etcd and kube-apiserver in a private sandbox.

Both run inside a :class:`tests.e2e.sandbox.Sandbox` (own mount, network and PID
namespaces): the API server listens on the sandbox's 127.0.0.1 only, etcd keeps its data
on the sandbox's tmpfs, and everything ends with the sandbox. Clients authenticate with
bearer tokens from a static token file (one identity per node, so the audit log tells
the nodes apart), and the API server writes an audit log (metadata of every request)
that the benches count requests from. Binaries: kube-apiserver of the newest release
tools/build-k8s.sh built (``build/k8s/1.37``, or under ``$K8S_BIN_DIR``): what a current
cluster runs, DRAConsumableCapacity on from 1.36; etcd from Debian.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import ssl
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.e2e.sandbox import Process, Sandbox
from tests.harness.apiserver import https_request, k8s_bin_dir, newest_release, write_kubeconfig, write_pki

REPO = Path(__file__).resolve().parents[1]
API_PORT = 6443
ADVERTISE_IP = "10.98.0.1"  # on a bridge of the sandbox: the API server needs a non-loopback address
ETCD_URL = "http://127.0.0.1:2379"
ADMIN = "bench-admin"
# Requests: every request's metadata, once at its end (a watch also when it starts).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


def keeps_shared_devices(git_version: str) -> bool:
    """Whether the API server keeps a device's allowMultipleAllocations (DRAConsumableCapacity,
    on by default from 1.36): then our daemon publishes each resource's shareable device
    beside its slots, else the slots alone."""
    found = re.match(r"v(\d+)\.(\d+)\.", git_version)
    return found is not None and (int(found[1]), int(found[2])) >= (1, 36)


def bin_dir() -> Path:
    """The Kubernetes binaries the scale benches run: the newest release built."""
    return k8s_bin_dir(newest_release())


def missing() -> str | None:
    """Why no control plane can run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (private namespaces)"
    if not (bin_dir() / "kube-apiserver").is_file():
        return f"no {bin_dir() / 'kube-apiserver'} (tools/build-k8s.sh)"
    if shutil.which("etcd") is None:
        return "no etcd on PATH (Debian etcd-server)"
    for tool in ("unshare", "nsenter", "openssl", "ip"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    return None


@dataclass(frozen=True)
class AuditEvent:
    user: str
    verb: str
    resource: str
    stage: str  # ResponseStarted (a watch began) or ResponseComplete
    code: int
    at: float  # stageTimestamp, seconds since the epoch
    uri: str
    audit_id: str

    @property
    def is_request(self) -> bool:
        """Each request counts once: a watch when it starts, anything else when it ends."""
        return self.stage == ("ResponseStarted" if self.verb == "watch" else "ResponseComplete")


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class ControlPlane:
    """etcd + kube-apiserver; :meth:`up` starts them, :meth:`close` ends everything."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.pki = work / "pki"
        self.pki.mkdir(parents=True, exist_ok=True)
        self.audit_path = work / "audit.log"
        self.sandbox = Sandbox(work / "logs")
        self.tokens: dict[str, tuple[str, str]] = {}  # user -> (token, groups)
        self.apiserver: Process | None = None
        self.etcd: Process | None = None
        self._audit_offset = 0
        self._audit: list[AuditEvent] = []
        self.starts = 0
        self.start_times: list[float] = []  # time.time() of each kube-apiserver start

    # --- bring-up -------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> None:
        self._certificates()
        self.add_user(ADMIN, "system:masters")
        self.sandbox.start()
        for cmd in (
            ["ip", "link", "add", "bench0", "type", "bridge"],
            ["ip", "addr", "add", f"{ADVERTISE_IP}/24", "dev", "bench0"],
            ["ip", "link", "set", "bench0", "up"],
        ):
            self.sandbox.run(cmd)
        self.etcd = self.sandbox.spawn("etcd", [
            "etcd", "--name", "bench", "--data-dir", "/var/lib/bench-etcd",
            "--listen-client-urls", ETCD_URL, "--advertise-client-urls", ETCD_URL,
            "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "bench=http://127.0.0.1:2380", "--log-level", "warn",
        ])  # fmt: skip
        self.start_apiserver()

    def _certificates(self) -> None:
        write_pki(self.pki, "bench", ["127.0.0.1", ADVERTISE_IP])
        (self.work / "audit-policy.yaml").write_text(AUDIT_POLICY)

    def add_user(self, user: str, groups: str = "") -> Path:
        """A token for ``user`` (comma-separated ``groups``) and its kubeconfig. The API server
        reads its token file at start: add users before :meth:`up` or restart it after."""
        token = secrets.token_hex(16)
        self.tokens[user] = (token, groups)
        lines = [f'{t},{u},{u},"{g}"' for u, (t, g) in self.tokens.items()]
        (self.pki / "tokens.csv").write_text("\n".join(lines) + "\n")
        server = f"https://127.0.0.1:{API_PORT}"
        return write_kubeconfig(self.kubeconfig(user), server, self.pki / "ca.crt", user, token)

    def kubeconfig(self, user: str = ADMIN) -> Path:
        return self.pki / f"{user.replace(':', '_')}.kubeconfig"

    @property
    def apiserver_argv(self) -> list[str]:
        pki = self.pki
        return [
            str(bin_dir() / "kube-apiserver"), f"--etcd-servers={ETCD_URL}",
            "--bind-address=127.0.0.1", f"--secure-port={API_PORT}", f"--advertise-address={ADVERTISE_IP}",
            f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
            f"--token-auth-file={pki}/tokens.csv",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--audit-policy-file={self.work}/audit-policy.yaml", f"--audit-log-path={self.audit_path}",
            "--audit-log-format=json", "--audit-log-maxsize=0", "--v=1",
        ]  # fmt: skip

    def start_apiserver(self, timeout: float = 180.0) -> float:
        """Starts kube-apiserver and waits for /readyz; returns when it was ready (time.time())."""
        self.starts += 1
        self.start_times.append(time.time())
        self.apiserver = self.sandbox.spawn(f"kube-apiserver-{self.starts}", self.apiserver_argv)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.apiserver.running():
                raise RuntimeError(f"kube-apiserver exited:\n{self.apiserver.log_tail()}")
            with contextlib.suppress(OSError, ssl.SSLError, http.client.HTTPException):
                if self.request("GET", "/readyz", timeout=5)[0] == 200:
                    return time.time()
            time.sleep(0.1)
        raise RuntimeError(f"kube-apiserver not ready within {timeout:.0f}s:\n{self.apiserver.log_tail()}")

    def stop_apiserver(self, grace_s: float = 10.0) -> float:
        """SIGTERM, SIGKILL after ``grace_s`` (with watches open its own shutdown waits 60 s for
        them, longer than a kubelet's grace period for a static pod); returns once it exited."""
        assert self.apiserver is not None
        self.apiserver.stop(timeout=grace_s)
        self.sandbox.processes.remove(self.apiserver)
        self.apiserver = None
        return time.time()

    def close(self) -> None:
        self.sandbox.close()

    # --- use ------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, timeout: float = 30, user: str = ADMIN
    ) -> tuple[int, Any]:
        """One HTTPS request from inside the sandbox; the JSON answer (or text)."""
        token, ca = self.tokens[user][0], self.pki / "ca.crt"
        return self.sandbox.in_netns(lambda: https_request(API_PORT, ca, token, method, path, body, timeout))

    def must(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    def apply_rbac(self, name: str, group: str, rules: Sequence[dict[str, Any]]) -> None:
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self.must("POST", f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": list(rules)})
        self.must("POST", f"{rbac}/clusterrolebindings", {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        })  # fmt: skip

    def create_node(self, name: str) -> None:
        self.must("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})

    def metrics_text(self) -> str:
        status, text = self.request("GET", "/metrics", timeout=60)
        if status != 200:
            raise RuntimeError(f"/metrics: {status}")
        return str(text)

    def etcd_metrics_text(self) -> str:
        return self.sandbox.http_get(f"{ETCD_URL}/metrics", timeout=30)[1]

    def pids(self) -> dict[str, int]:
        """Host PIDs of kube-apiserver and etcd."""
        out = {}
        for name, proc in (("kube-apiserver", self.apiserver), ("etcd", self.etcd)):
            if proc is not None and proc.running():
                out[name] = proc.pid
        return out

    def audit(self) -> list[AuditEvent]:
        """Every audit event so far (read on from where the last call stopped)."""
        if self.audit_path.exists():
            with self.audit_path.open("rb") as f:
                f.seek(self._audit_offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self._audit_offset += end
            for raw in data[:end].splitlines():
                with contextlib.suppress(json.JSONDecodeError, KeyError):
                    e = json.loads(raw)
                    ref = e.get("objectRef") or {}
                    self._audit.append(AuditEvent(
                        user=e["user"].get("username", ""), verb=e["verb"], resource=ref.get("resource", ""),
                        stage=e["stage"], code=int((e.get("responseStatus") or {}).get("code", 0)),
                        at=_epoch(e["stageTimestamp"]), uri=e.get("requestURI", ""), audit_id=e.get("auditID", ""),
                    ))  # fmt: skip
        return self._audit

    def open_watches(self, at: float, users: set[str]) -> int:
        """Watches of ``users`` open at ``at``: started since the API server's start before
        ``at`` (a killed one never logs the end of its watches) and not ended by then."""
        since = max((t for t in self.start_times if t <= at), default=0.0)
        started = {e.audit_id for e in self.audit() if e.user in users and e.verb == "watch"
                   and e.stage == "ResponseStarted" and since <= e.at <= at}  # fmt: skip
        ended = {e.audit_id for e in self.audit() if e.verb == "watch" and e.stage == "ResponseComplete" and e.at <= at}
        return len(started - ended)

    def requests(self, since: float, until: float, users: set[str] | None = None) -> Iterator[AuditEvent]:
        for e in self.audit():
            if e.is_request and since <= e.at < until and (users is None or e.user in users):
                yield e
