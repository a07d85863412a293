"""A real API server for the DRA driver's tests: etcd and kube-apiserver, nothing else.

Both listen on 127.0.0.1 only (free ports), keep their data in a directory of the test's,
and stop when the context ends. No controllers, scheduler or kubelet run: a test plays
those parts by writing objects (a Node, ResourceClaims with an allocation in their
status) with an admin token. The daemon gets a kubeconfig of its own identity, bound to
the permissions the chart's ClusterRole grants. The advertise address is loopback and no
endpoint reconciler runs, so nothing is ever sent to another address.
Binaries: kube-apiserver from tools/build-k8s.sh (``build/k8s/1.35``, or under ``$K8S_BIN_DIR``),
etcd from Debian (etcd-server).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.harness.net import free_port
from tests.harness.process import stop_process

REPO = Path(__file__).resolve().parents[2]
ADMIN = "test-admin"
DRIVER_USER = "ate-devplugin"
# The chart's ClusterRole for the daemon (chart/templates/rbac.yaml), DRA part.
DRIVER_RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]  # fmt: skip


# The tests' API server: 1.35, where DRAConsumableCapacity is off (the slots-only path).
TEST_RELEASE = "1.35"


def k8s_bin_dir(release: str = TEST_RELEASE) -> Path:
    """tools/build-k8s.sh's output for a release: ``$K8S_BIN_DIR/<release>`` (build/k8s by default)."""
    return Path(os.environ.get("K8S_BIN_DIR", REPO / "build" / "k8s")) / release


def newest_release() -> str:
    """The newest release tools/build-k8s.sh built (the tests' release when none is)."""
    built = [d.name for d in k8s_bin_dir().parent.glob("*") if (d / "kube-apiserver").is_file()]
    return max(built, key=lambda r: tuple(int(x) for x in r.split(".") if x.isdigit()), default=TEST_RELEASE)


def missing(release: str = TEST_RELEASE, binary: str = "kube-apiserver") -> str | None:
    """Why no API server (or another ``binary`` of ``release``) can run here (None: it can)."""
    if not (k8s_bin_dir(release) / binary).is_file():
        return f"no {k8s_bin_dir(release) / binary}: run tools/build-k8s.sh {release}"
    for tool, package in (("etcd", "etcd-server"), ("openssl", "openssl")):
        if shutil.which(tool) is None:
            return f"{tool} not found; install with: apt-get install -y {package}"
    return None


def write_pki(pki: Path, name: str, addresses: Sequence[str]) -> None:
    """In ``pki``: a CA (``<name>-ca``), the API server's serving certificate for localhost
    and ``addresses``, and the service-account key pair."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN={name}-ca")
    sans = ",".join(["DNS:localhost", *(f"IP:{a}" for a in addresses)])
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n"
    )
    openssl("req", "-new", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=apiserver")
    openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", "apiserver.ext", "-out", "apiserver.crt")  # fmt: skip
    openssl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key")
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, token: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}],
    }))  # fmt: skip
    return path


def https_request(
    port: int, ca: Path, token: str, method: str, path: str, body: Any = None, timeout: float = 30
) -> tuple[int, Any]:
    """One HTTPS request to 127.0.0.1:``port`` with a bearer token: the status and the JSON
    answer (or its text)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except json.JSONDecodeError:
        return response.status, raw


class ApiServer:
    """etcd + kube-apiserver of ``release`` in ``work``, and a kube-scheduler on demand; a
    context manager."""

    def __init__(self, work: Path, release: str = TEST_RELEASE) -> None:
        self.work = work
        self.release = release
        self.pki = work / "pki"
        self.port = free_port()
        self.etcd_port, self.peer_port = free_port(), free_port()
        self.tokens = {ADMIN: (secrets.token_hex(16), "system:masters"), DRIVER_USER: (secrets.token_hex(16), "")}
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.scheduler: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- bring-up -------------------------------------------------------------------

    def up(self, timeout: float = 120) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        self._certificates()
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = self._spawn("etcd", [
            "etcd", "--name", "t", "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"t={peer_url}", "--log-level", "warn",
        ])  # fmt: skip
        pki = self.pki
        self.apiserver = self._spawn("kube-apiserver", [
            str(k8s_bin_dir(self.release) / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
            f"--token-auth-file={pki}/tokens.csv",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
            "--service-cluster-ip-range=10.96.0.0/24", "--authorization-mode=RBAC", "--v=1",
        ])  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.apiserver.poll() is not None:
                raise RuntimeError(f"kube-apiserver exited:\n{self.log_tail('kube-apiserver')}")
            with contextlib.suppress(OSError, ssl.SSLError, http.client.HTTPException):
                if self.request("GET", "/readyz", timeout=5)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"kube-apiserver not ready in {timeout:.0f}s:\n{self.log_tail('kube-apiserver')}")
            time.sleep(0.2)
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self.must("POST", f"{rbac}/clusterroles", {"metadata": {"name": DRIVER_USER}, "rules": DRIVER_RULES})
        self.must("POST", f"{rbac}/clusterrolebindings", {
            "metadata": {"name": DRIVER_USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": DRIVER_USER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": DRIVER_USER}],
        })  # fmt: skip

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _certificates(self) -> None:
        """The PKI for 127.0.0.1 and the tokens."""
        write_pki(self.pki, "test", ["127.0.0.1"])
        lines = [f'{token},{user},{user},"{groups}"' for user, (token, groups) in self.tokens.items()]
        (self.pki / "tokens.csv").write_text("\n".join(lines) + "\n")

    def kubeconfig(self, user: str = DRIVER_USER) -> Path:
        return write_kubeconfig(self.pki / f"{user}.kubeconfig", f"https://127.0.0.1:{self.port}",
                                self.pki / "ca.crt", user, self.tokens[user][0])  # fmt: skip

    def start_scheduler(self) -> None:
        """The release's kube-scheduler, as admin, serving nothing of its own (no port to
        clash with another test's): it allocates claims and binds pods; no kubelet runs them."""
        kubeconfig = self.kubeconfig(ADMIN)
        self.scheduler = self._spawn("kube-scheduler", [
            str(k8s_bin_dir(self.release) / "kube-scheduler"), f"--kubeconfig={kubeconfig}",
            "--leader-elect=false", "--secure-port=0", "--v=1",
        ])  # fmt: skip

    def close(self) -> None:
        for proc in (self.scheduler, self.apiserver, self.etcd):
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)  # a paused one must hear the SIGTERM
                stop_process(proc, timeout=15)
        self.scheduler = self.apiserver = self.etcd = None

    def log_tail(self, name: str, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return (self.work / f"{name}.log").read_text(errors="replace")[-chars:]
        return ""

    # --- faults ---------------------------------------------------------------------

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """kube-apiserver stopped (SIGSTOP): connections are accepted, nothing answers."""
        assert self.apiserver is not None
        self.apiserver.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.apiserver.send_signal(signal.SIGCONT)

    # --- use ------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, timeout: float = 30, user: str = ADMIN
    ) -> tuple[int, Any]:
        """One HTTPS request: the status and the JSON answer (or its text)."""
        return https_request(self.port, self.pki / "ca.crt", self.tokens[user][0], method, path, body, timeout)

    def many(self, calls: Sequence[tuple[str, str, Any]], threads: int = 8) -> list[Any]:
        """Many (method, path, body) calls as admin, ``threads`` at once on kept-alive
        connections (making 10,000 objects one connection each would take minutes)."""
        local = threading.local()
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        headers = {"Authorization": f"Bearer {self.tokens[ADMIN][0]}", "Accept": "application/json",
                   "Content-Type": "application/json"}  # fmt: skip

        def call(one: tuple[str, str, Any]) -> Any:
            method, path, body = one
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=60)
            local.conn.request(method, path, body=json.dumps(body).encode(), headers=headers)
            response = local.conn.getresponse()
            answer = json.loads(response.read())
            if response.status >= 300:
                raise RuntimeError(f"{method} {path}: {response.status} {answer}")
            return answer

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(call, calls))

    def must(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    # --- objects --------------------------------------------------------------------

    def create_node(self, name: str) -> None:
        self.must("POST", "/api/v1/nodes", {"metadata": {"name": name}})

    def slices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.must("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
        return items

    def create_slices(self, names: Sequence[str], node: str, pool: str, generation: int) -> None:
        """Empty slices of our driver on ``node``, as another client would write them."""
        self.many([("POST", "/apis/resource.k8s.io/v1/resourceslices", {
            "metadata": {"name": name},
            "spec": {"driver": "ate.dev", "nodeName": node, "devices": [],
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}},
        }) for name in names])  # fmt: skip

    def create_claims(self, namespace: str, names: Sequence[str], node: str, device: str) -> list[str]:
        """Claims each allocated ``device`` of this node's pool (as the scheduler writes it); their UIDs."""
        base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
        spec = {"devices": {"requests": [{"name": "kvm", "exactly": {"deviceClassName": "kvm.ate.dev"}}]}}
        claims = self.many([("POST", base, {"metadata": {"name": name}, "spec": spec}) for name in names])
        result = {"request": "kvm", "driver": "ate.dev", "pool": node, "device": device}
        for claim in claims:
            claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        self.many([("PUT", f"{base}/{c['metadata']['name']}/status", c) for c in claims])
        return [str(c["metadata"]["uid"]) for c in claims]

    def create_namespace(self, name: str) -> None:
        self.must("POST", "/api/v1/namespaces", {"metadata": {"name": name}})


class WatchCutter:
    """A TLS front of the API server that ends every watch at once (what a load balancer
    with a short idle timeout does), forwarding every other request; counts the watches.
    It serves with the API server's own certificate, so a kubeconfig only changes port."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.watches = 0
        cutter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                if "watch=true" in self.path:
                    cutter.watches += 1
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                ctx = ssl.create_default_context(cafile=str(api.pki / "ca.crt"))
                conn = http.client.HTTPSConnection("127.0.0.1", api.port, context=ctx, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status)
                self.send_header("Content-Type", response.getheader("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(api.pki / "apiserver.crt", api.pki / "apiserver.key")
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self) -> Path:
        """The driver's kubeconfig, through this front."""
        path = self.api.kubeconfig()
        config = json.loads(path.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        front = path.with_name("through-cutter.kubeconfig")
        front.write_text(json.dumps(config))
        return front
