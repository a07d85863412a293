"""A real Kubernetes cluster inside a :class:`~e2e.sandbox.Sandbox`: a control plane and
one or more nodes.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) runs in
the sandbox itself, as a cluster's control plane host would. Each node, as a kind node is
a container, has mount and network namespaces of its own inside the sandbox
(:meth:`Sandbox.node`), with its own containerd (runc, the CNI bridge plugin), kubelet,
root directories, cgroup root and pod subnet. Certificates from one CA, RBAC and node
authorization, no privileged pods. No kube-proxy and no DNS: the tests reach pods by
their IPs, from inside the sandbox. Debian's containerd, runc, etcd and CNI plugins; the
Kubernetes binaries from tools/build-k8s.sh, of one release per cluster (``1.35`` or
``1.37``; kubectl is 1.35's for both).

The network, all of it inside the sandbox (nothing reaches the host's):

* the nodes' bridge :data:`NODES_BRIDGE` in the sandbox, :data:`GATEWAY` on it, and one
  veth per node: node ``i`` is ``10.88.0.(11+i)``, its default route the gateway;
* each node's pods on a bridge of that node, in ``10.88.(1+i).0/24``, their default route
  the node; the sandbox routes each pod subnet to its node, so pods of different nodes,
  the API server, the test's Prometheus and :meth:`Sandbox.http_get` reach every pod;
* the API server listens on port 443 of every address of the sandbox: :data:`GATEWAY`
  (its advertise address, the kubeconfigs' server) and :data:`API_SERVICE_IP`, the
  ``kubernetes`` Service's ClusterIP, an address of the sandbox too: a pod's in-cluster
  client reaches the API server through the Service without kube-proxy;
* a server that needs a port the API server holds there (an HTTPS registry's 443) runs in
  namespaces of its own on the nodes' bridge (:meth:`Cluster.attach`), at an address below
  the nodes' (tests/e2e/registry.py: ``10.88.0.2``);
* names: the cluster's own ``/etc/hosts`` (:attr:`Cluster.hosts_file`) is bind-mounted over
  the sandbox's before any node comes up, so every node's mount namespace, a copy of the
  sandbox's, has it too; :meth:`Cluster.set_host` writes it in place and a name it adds
  resolves at once in the sandbox and on every node (``ghcr.io``, the registry).

Two things of this kind of host are handled here, both found bringing a node up:

* root may lack CAP_SYS_RESOURCE: runc then cannot set the kubelet's ``oom_score_adj``
  of -998 for pod sandboxes and every pod fails (``can't get final child's PID from pipe:
  EOF``). containerd's ``restrict_oom_score_adj`` clamps the score instead.
* the host runs cgroup v1: kubelets 1.35 and 1.37 refuse it unless ``failCgroupV1: false``.

Each node's pods' cgroups go under a cgroup root of its own
(``/ate-e2e-<pid>-<cluster>-<node>`` in every v1 hierarchy), removed by
:meth:`Cluster.close`, so two runs, two clusters of a run or two nodes never share one.

Two container runtimes (``Cluster(runtime=...)``): Debian's containerd 1.6 (the default,
as the user's node most likely has), or containerd 2 built by tools/build-containerd.sh,
the one with CDI: it resolves CDI device names against the specs in the node's
``/var/run/cdi``. Both run pods with Debian's runc. Every node's containerd reads registry
hosts from :attr:`Cluster.registry_config_dir` (CRI ``config_path``): a registry in the
sandbox is made known to every node by writing ``<host:port>/hosts.toml`` there (read at
each pull, no restart), naming an address every node reaches (:data:`GATEWAY`) or a name
of :meth:`Cluster.set_host`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.e2e import cgroups
from tests.e2e.sandbox import NodeNamespaces, Process, Sandbox, SandboxError

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
#: The releases tools/build-k8s.sh builds; a cluster runs one of them.
RELEASES = ("1.35", "1.37")
DEFAULT_RELEASE = "1.35"
#: kubectl of this release is the client of every cluster (built once).
CLIENT_RELEASE = "1.35"
NODE = "e2e-node"  # the first node's name
GATEWAY = "10.88.0.1"  # the sandbox on the nodes' bridge: API server, and servers a test starts for nodes
NODES_BRIDGE = "e2e-nodes0"
POD_BRIDGE = "cni-e2e0"  # in each node's network namespace
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service
API_PORT = 443
API = f"https://{GATEWAY}:{API_PORT}"
PAUSE_IMAGE = "localhost/pause:e2e"
CNI_BIN_DIR = "/usr/lib/cni"
CGROUP_VERSIONS = (1, 2)
SERVER_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "pause")
# The container runtimes a cluster can run.
DEBIAN_CONTAINERD = "containerd"  # Debian's containerd 1.6, on PATH: no CDI
CONTAINERD2 = "containerd2"  # containerd 2 from build/containerd2: CDI
RUNTIMES = (DEBIAN_CONTAINERD, CONTAINERD2)
CONTAINERD2_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
# Where containerd 2 reads CDI specs: only the node's /var/run/cdi (a tmpfs over /run),
# not the host's /etc/cdi, so nothing of the host's reaches the cluster.
CDI_SPEC_DIR = "/var/run/cdi"


def k8s_bin_dir() -> Path:
    """tools/build-k8s.sh's output: one directory per release."""
    env = os.environ.get("K8S_BIN_DIR")
    return Path(env) if env else REPO / "build" / "k8s"


def containerd2_bin_dir() -> Path:
    """tools/build-containerd.sh's output."""
    env = os.environ.get("CONTAINERD2_BIN_DIR")
    return Path(env) if env else REPO / "build" / "containerd2"


def node_name(index: int) -> str:
    return NODE if index == 0 else f"{NODE}-{index + 1}"


class ClusterError(RuntimeError):
    """The cluster did not come up, or did not reach an expected state in time."""


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something other than None or False; return it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except (SandboxError, ClusterError, OSError, KeyError, subprocess.TimeoutExpired) as exc:
            last = exc  # not there yet (a pod without an IP, a refused connection): try again
        else:
            if last is not None and last is not False:
                found: T = last
                return found
        if time.monotonic() >= deadline:
            raise ClusterError(f"timeout ({timeout:.0f}s) waiting for {what}; last: {last}")
        time.sleep(interval)


def lacks_cap_sys_resource() -> bool:
    with open("/proc/self/status") as status:
        cap_eff = next(line.split()[1] for line in status if line.startswith("CapEff:"))
    return not (int(cap_eff, 16) >> 24) & 1  # CAP_SYS_RESOURCE is capability 24


def ns_pid(host_pid: int) -> int:
    """The PID ``host_pid`` has in its own (the sandbox's) PID namespace."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1])


class Cluster:
    """The control plane and its nodes; :meth:`up` starts them, :meth:`close` ends them."""

    def __init__(
        self,
        sandbox: Sandbox,
        workdir: Path,
        k8s_bin: Path,
        images: Sequence[Path],
        runtime: str = DEBIAN_CONTAINERD,
        containerd2_bin: Path | None = None,
        *,
        release: str = DEFAULT_RELEASE,
        nodes: int = 1,
        cgroup: int = 1,
    ) -> None:
        """``k8s_bin`` holds one directory per release (tools/build-k8s.sh's output);
        ``cgroup`` is the version the nodes run on (see :mod:`tests.e2e.cgroups`)."""
        if runtime not in RUNTIMES or (runtime == CONTAINERD2) != (containerd2_bin is not None):
            raise ValueError(f"runtime {runtime!r} (one of {RUNTIMES}; {CONTAINERD2} with its binaries' directory)")
        if release not in RELEASES or nodes < 1 or cgroup not in CGROUP_VERSIONS:
            raise ValueError(f"release {release!r} (one of {RELEASES}), nodes {nodes} (at least 1), "
                             f"cgroup {cgroup} (one of {CGROUP_VERSIONS})")  # fmt: skip
        self.sandbox = sandbox
        self.dir = workdir
        self.release = release
        self.bin = k8s_bin / release
        self.kubectl_path = k8s_bin / CLIENT_RELEASE / "kubectl"
        self.images = list(images)
        self.runtime = runtime
        self.containerd2_bin = containerd2_bin
        self.node_count = nodes
        self.cgroup = cgroup
        self.pki = workdir / "pki"
        self.kubeconfig = self.pki / "admin.kubeconfig"
        #: CRI registry ``config_path`` of every node: ``<host:port>/hosts.toml`` files.
        self.registry_config_dir = workdir / "registry-hosts"
        #: ``/etc/hosts`` of the sandbox and of every node (bind-mounted by :meth:`up`).
        self.hosts_file = workdir / "hosts"
        self.key = f"{release}-{runtime}-{nodes}-cgroup{cgroup}"
        self.nodes: list[Node] = []
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                    "PATH": f"{self.kubectl_path.parent}:{os.environ['PATH']}"}  # fmt: skip

    @property
    def node(self) -> Node:
        """The first node (``e2e-node``)."""
        return self.nodes[0]

    # --- bring-up -------------------------------------------------------------------

    def up(self) -> None:
        start = time.monotonic()
        for d in ("pki", "etcd", "registry-hosts"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self._certificates()
        self._hosts()
        self._network()
        self._control_plane()
        cgroups.remove_stale()
        # One after the other, from this thread: each long-running process dies with the
        # thread that started it (PR_SET_PDEATHSIG), so no worker thread may start one.
        for index in range(self.node_count):
            node = Node(self, index)
            self.nodes.append(node)
            node.up()
        for node in self.nodes:
            node.wait_ready()
        print(f"cluster {self.key} up in {time.monotonic() - start:.1f}s (kubelet {self.version()})")

    def openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.pki, check=True, capture_output=True, timeout=60)

    def certificate(self, name: str, subject: str, san: str = "") -> None:
        """``<name>.key`` and ``<name>.crt`` signed by the CA: a client certificate, or a
        serving one (client too) for ``san``. EC P-256 keys: fast to make."""
        ext = self.pki / f"{name}.ext"
        usage = "serverAuth,clientAuth" if san else "clientAuth"
        ext.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else "")
        )
        self.openssl("req", "-new", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        self.openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                     "-days", "2", "-sha256", "-extfile", ext.name, "-out", f"{name}.crt")  # fmt: skip

    def write_kubeconfig(self, user: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": API,
                                                     "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": str(self.pki / f"{user}.crt"),
                                              "client-key": str(self.pki / f"{user}.key")}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }  # fmt: skip
        path = self.pki / f"{user}.kubeconfig"
        path.write_text(json.dumps(config))
        return path

    def _certificates(self) -> None:
        """One CA; the control plane's client and serving certificates; kubeconfigs."""
        if (self.pki / "ca.crt").exists():
            return
        self.openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                     "-subj", "/CN=ate-e2e-ca")  # fmt: skip
        names = f"DNS:localhost,DNS:kubernetes.default,IP:127.0.0.1,IP:{GATEWAY},IP:{API_SERVICE_IP}"
        self.certificate("apiserver", "/CN=kube-apiserver", names)
        for name, subject in {
            "apiserver-kubelet-client": "/CN=kube-apiserver-kubelet-client",
            "admin": "/O=system:masters/CN=admin",
            "controller-manager": "/CN=system:kube-controller-manager",
            "scheduler": "/CN=system:kube-scheduler",
        }.items():
            self.certificate(name, subject)
        self.openssl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key")
        self.openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        for user in ("admin", "controller-manager", "scheduler"):
            self.write_kubeconfig(user)

    def _hosts(self) -> None:
        """The sandbox's /etc/hosts (the host's) copied to :attr:`hosts_file` and bind-mounted
        over it there: every node's mount namespace, made later as a copy, has the mount too."""
        self.hosts_file.write_text(self.sandbox.run(["cat", "/etc/hosts"]).stdout)
        self.sandbox.run(["mount", "--bind", str(self.hosts_file), "/etc/hosts"])

    def set_host(self, name: str, address: str | None) -> None:
        """``name`` resolving to ``address`` in the sandbox and on every node (None: the name
        removed). Written in place: every bind mount of the file sees it at once."""
        lines = [line for line in self.hosts_file.read_text().splitlines() if line.split()[1:] != [name]]
        if address is not None:
            lines.append(f"{address} {name}")
        self.hosts_file.write_text("".join(f"{line}\n" for line in lines))

    def _network(self) -> None:
        """The nodes' bridge and the Service address, in the sandbox; forwarding between nodes."""
        for cmd in (
            ["ip", "link", "add", NODES_BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{GATEWAY}/24", "dev", NODES_BRIDGE],
            ["ip", "link", "set", NODES_BRIDGE, "up"],
            ["ip", "addr", "add", f"{API_SERVICE_IP}/32", "dev", "lo"],
            ["sh", "-ec", "echo 1 > /proc/sys/net/ipv4/ip_forward"],  # this namespace's own setting
        ):
            self.sandbox.run(cmd)

    def _control_plane(self) -> None:
        pki = self.pki
        self.sandbox.spawn("etcd", [
            "etcd", "--name", "e2e", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
            "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "e2e=http://127.0.0.1:2380",
        ])  # fmt: skip
        self.sandbox.spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--etcd-servers=http://127.0.0.1:2379",
            # Every address of the sandbox's own network namespace: the gateway, where nodes
            # reach it, and the `kubernetes` Service's ClusterIP, where pods do.
            "--bind-address=0.0.0.0", f"--secure-port={API_PORT}", f"--advertise-address={GATEWAY}",
            f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
            f"--client-ca-file={pki}/ca.crt",
            f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
            f"--kubelet-certificate-authority={pki}/ca.crt", "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=false", "--v=1",
        ])  # fmt: skip
        wait_until("kube-apiserver /readyz", lambda: self.kubectl("get", "--raw", "/readyz", check=False) == "ok", 180)
        for name, user in (("kube-controller-manager", "controller-manager"), ("kube-scheduler", "scheduler")):
            kubeconfig = f"{pki}/{user}.kubeconfig"
            extra = [
                "--use-service-account-credentials", f"--service-account-private-key-file={pki}/sa.key",
                f"--root-ca-file={pki}/ca.crt", f"--cluster-signing-cert-file={pki}/ca.crt",
                f"--cluster-signing-key-file={pki}/ca.key", f"--service-cluster-ip-range={SERVICE_CIDR}",
            ] if user == "controller-manager" else []  # fmt: skip
            self.sandbox.spawn(name, [
                str(self.bin / name), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1", "--leader-elect=false",
                *extra, "--v=1",
            ])  # fmt: skip
        # The API server's own identity on the kubelet (logs, exec).
        rbac = "rbac.authorization.k8s.io"
        self.apply({
            "apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "e2e-apiserver-kubelet"},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "kube-apiserver-kubelet-client"}],
        })  # fmt: skip

    def attach(self, ns: NodeNamespaces, veth: str, ip: str) -> None:
        """Put ``ns`` on the nodes' bridge as ``ip`` (its ``eth0``, default route the gateway):
        a node, or a server of its own namespaces that every node reaches."""
        self.sandbox.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                          "netns", str(ns_pid(ns.init_pid))])  # fmt: skip
        self.sandbox.run(["ip", "link", "set", veth, "master", NODES_BRIDGE, "up"])
        for cmd in (
            ["ip", "addr", "add", f"{ip}/24", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "route", "add", "default", "via", GATEWAY],
        ):
            ns.run(cmd)

    # --- use ------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        out = self.sandbox.run([str(self.kubectl_path), *args], stdin=stdin, check=check, timeout=timeout,
                               env=self.env)  # fmt: skip
        return out.stdout.strip() if out.returncode == 0 else ""

    def get_json(self, *args: str, check: bool = True) -> Any:
        text = self.kubectl("get", *args, "-o", "json", check=check)
        return json.loads(text) if text else None

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def version(self) -> str:
        info = json.loads(self.kubectl("version", "-o", "json"))
        return str(info["serverVersion"]["gitVersion"])

    def node_named(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # --- teardown -------------------------------------------------------------------

    def close(self) -> None:
        """Stop the kubelets first (no pod restarted behind our back), then everything with
        the sandbox, then remove the nodes' cgroups."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                if node.kubelet is not None:
                    node.stop_kubelet()
        self.sandbox.close()
        for node in self.nodes:
            node.remove_cgroups()
        cgroups.release_controllers()


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

# A v2 node's containerd runs runc through this wrapper, for two things of this host only
# (docs/e2e-nodes.md); a real v2 host needs neither. At `create` it edits the bundle's spec:
# * runc writes every limit of the spec and fails on a controller its hierarchy lacks
#   ("cpu.weight: no such file or directory"), and the unified hierarchy here offers only
#   what the host's v1 hierarchies leave (hugetlb): the limits of controllers that
#   /sys/fs/cgroup does not offer are dropped;
# * the kubelet runs without QoS cgroups there and so gives containerd no cgroup parent;
#   containerd's default, /k8s.io/<id>, would be one directory for every node's
#   containers: they go under the node's cgroup root (argv[1]) instead.
# Nothing else changes: the device rules, which runc turns into its eBPF filter, above all.
_SPEC_FOR_V2 = r"""
import json, sys
root, args = sys.argv[1], sys.argv[2:]
bundle = next((a.split("=", 1)[1] for a in args if a.startswith("--bundle=")), None)
bundle = bundle or next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--bundle", "-b")), ".")
path = bundle + "/config.json"
with open(path) as f:
    spec = json.load(f)
limits = (spec.get("linux") or {}).get("resources") or {}
offered = set(open("/sys/fs/cgroup/cgroup.controllers").read().split())
for key, controller in {"cpu": "cpu", "memory": "memory", "pids": "pids", "blockIO": "io",
                        "hugepageLimits": "hugetlb", "rdma": "rdma"}.items():
    if key in limits and controller not in offered:
        del limits[key]
for name in list(limits.get("unified") or {}):
    if name.split(".")[0] not in offered:
        del limits["unified"][name]
parts = (spec.get("linux") or {}).get("cgroupsPath", "").strip("/").split("/")
if len(parts) == 2 and parts[0] == "k8s.io":
    spec["linux"]["cgroupsPath"] = root + "/" + parts[1]
with open(path, "w") as f:
    json.dump(spec, f)
"""
_RUNC_V2 = """#!/bin/sh
# runc for a cgroup v2 node of tests/e2e/cluster.py (see _SPEC_FOR_V2 there)
case " $* " in
*" create "*) {python} -c '{edit}' {root} "$@" || exit 1 ;;
esac
exec {runc} "$@"
"""


class Node:
    """One node: its namespaces, containerd and kubelet."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = node_name(index)
        self.ip = f"10.88.0.{11 + index}"
        self.pod_subnet = f"10.88.{1 + index}.0/24"
        self.pod_gateway = f"10.88.{1 + index}.1"
        self.dir = cluster.dir / self.name
        self.runtime = cluster.runtime
        self.containerd_sock = "/run/containerd/containerd.sock"
        self.cgroup_root = f"/ate-e2e-{os.getpid()}-{cluster.key}-{self.name}"
        # Device nodes owned by the pod's user: on for containerd 1.6, the setting the
        # user's path needs there; off for containerd 2, where a CDI spec gives the mode.
        self.device_ownership = cluster.runtime == DEBIAN_CONTAINERD
        self.ns: NodeNamespaces | None = None
        self.containerd: Process | None = None
        self.kubelet: Process | None = None

    def up(self) -> None:
        for d in ("cni/net.d", "containerd", "kubelet"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self.ns = self.cluster.sandbox.node(self.name)
        if self.cluster.cgroup == 2:
            # The kernel's cgroup2 hierarchy over the host's v1 mounts, in this node's
            # mount namespace only: the kubelet, containerd and runc here see a v2 host.
            self.run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])
        self._certificates()
        self._network()
        self.start_containerd()
        for archive in self.cluster.images:
            self.ctr("images", "import", str(archive), timeout=600)
        cgroups.make_root(self.cgroup_root, self.cluster.cgroup)
        self.start_kubelet()

    # --- in the node's namespaces ----------------------------------------------------

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command in the node's mount and network namespaces (see Namespaces.run)."""
        assert self.ns is not None
        return self.ns.run(argv, **kwargs)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        assert self.ns is not None
        return self.ns.spawn(f"{self.name}-{name}", argv, env=env)

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [self._containerd_binary("ctr"), "--address", self.containerd_sock, "-n", "k8s.io", *args]
        return self.run(argv, check=check, timeout=timeout)

    # --- bring-up -------------------------------------------------------------------

    def _certificates(self) -> None:
        c = self.cluster
        if (c.pki / f"{self.name}.kubeconfig").exists():
            return
        c.certificate(self.name, f"/O=system:nodes/CN=system:node:{self.name}")
        c.certificate(f"{self.name}-serving", f"/O=system:nodes/CN=system:node:{self.name}",
                      f"DNS:{self.name},IP:{self.ip}")  # fmt: skip
        c.write_kubeconfig(self.name)

    def _network(self) -> None:
        """A veth from the nodes' bridge into the node; the pods' bridge config; routes."""
        assert self.ns is not None
        self.cluster.attach(self.ns, f"e2e-veth{self.index}", self.ip)
        self.run(["sh", "-ec", "echo 1 > /proc/sys/net/ipv4/ip_forward"])  # pods to the sandbox and other nodes
        self.cluster.sandbox.run(["ip", "route", "add", self.pod_subnet, "via", self.ip])
        conflist = {
            "cniVersion": "1.0.0",
            "name": "e2e-pods",
            "plugins": [{
                "type": "bridge", "bridge": POD_BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_subnet, "gateway": self.pod_gateway,
                                                            "rangeStart": self.pod_subnet.replace(".0/24", ".10")}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.dir / "cni" / "ipam")},
            }],
        }  # fmt: skip
        (self.dir / "cni" / "net.d" / "10-e2e-bridge.conflist").write_text(json.dumps(conflist))

    def _containerd_config(self) -> Path:
        if self.runtime == CONTAINERD2:
            return self._containerd2_config()
        path = self.dir / "containerd" / "config.toml"
        d = self.dir / "containerd"
        path.write_text(f"""version = 2
root = "{d}/root"
state = "/run/containerd/state"
[grpc]
  address = "{self.containerd_sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Device nodes owned by the pod's runAsUser/runAsGroup instead of the host node's owner.
  device_ownership_from_security_context = {str(self.device_ownership).lower()}
  restrict_oom_score_adj = {str(lacks_cap_sys_resource()).lower()}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{self._runc()}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self.cluster.registry_config_dir}"
""")
        return path

    def _containerd2_config(self) -> Path:
        """Config version 3 (containerd 2 migrates it to its current one at start). CDI is
        always on in 2.x; only where the specs are is said."""
        path = self.dir / "containerd" / "config.toml"
        d = self.dir / "containerd"
        path.write_text(f"""version = 3
root = "{d}/root"
state = "/run/containerd/state"
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{self.containerd_sock}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"
# On by default in 2.x; it would listen on /var/run/nri/nri.sock, which nothing here uses.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{self.cluster.registry_config_dir}"
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['{CDI_SPEC_DIR}']
  device_ownership_from_security_context = {str(self.device_ownership).lower()}
  restrict_oom_score_adj = {str(lacks_cap_sys_resource()).lower()}
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{self._runc()}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{self.dir}/cni/net.d"
""")
        return path

    def _runc(self) -> str:
        """Debian's runc; on a cgroup v2 node, through :data:`_RUNC_V2` (written here)."""
        runc = shutil.which("runc") or "/usr/sbin/runc"
        if self.cluster.cgroup == 1:
            return runc
        wrapper = self.dir / "containerd" / "runc-v2"
        wrapper.write_text(_RUNC_V2.format(python=sys.executable, edit=_SPEC_FOR_V2, root=self.cgroup_root, runc=runc))
        wrapper.chmod(0o755)
        return str(wrapper)

    def _containerd_binary(self, name: str) -> str:
        bin_dir = self.cluster.containerd2_bin
        return name if bin_dir is None else str(bin_dir / name)

    def start_containerd(self) -> None:
        # containerd finds its shim on PATH: containerd 2's own before Debian's.
        bin_dir = self.cluster.containerd2_bin
        env = None if bin_dir is None else {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self.containerd = self.spawn(
            "containerd", [self._containerd_binary("containerd"), "--config", str(self._containerd_config())], env=env
        )
        wait_until(f"containerd of {self.name}", lambda: self.ctr("version", check=False).returncode == 0, 60)

    def restart_containerd(self, device_ownership: bool) -> None:
        """Restart containerd with ``device_ownership_from_security_context`` set as given.
        Running containers keep running (their shims outlive containerd)."""
        assert self.containerd is not None
        self.device_ownership = device_ownership
        self.containerd.stop()
        self.cluster.sandbox.processes.remove(self.containerd)
        self.start_containerd()

    def _kubelet_config(self) -> Path:
        pki = self.cluster.pki
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            # The pod sync, which also refreshes ConfigMap volumes: every 10 s instead of every
            # minute, so a live config change reaches the plugin in seconds.
            "syncFrequency": "10s",
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": f"{pki}/ca.crt"}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": f"{pki}/{self.name}-serving.crt",
            "tlsPrivateKeyFile": f"{pki}/{self.name}-serving.key",
            "resolvConf": "",  # no DNS for pods
            "imageGCHighThresholdPercent": 100,  # never remove the imported images
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        }  # fmt: skip
        if self.cluster.cgroup == 1:
            config["failCgroupV1"] = False  # kubelets >= 1.35 refuse cgroup v1 otherwise
        else:
            # No QoS cgroups: the unified hierarchy here lacks cpu, memory and pids, and a
            # restarted kubelet that finds its QoS cgroups sets their limits at start, and
            # dies of it (docs/e2e-nodes.md). Pods go under the cgroup root directly.
            config["cgroupsPerQOS"] = False
            config["enforceNodeAllocatable"] = []  # the kubelet requires cgroupsPerQOS for "pods"
        path = self.dir / "kubelet" / "config.yaml"
        path.write_text(json.dumps(config))
        return path

    def start_kubelet(self) -> Process:
        self.kubelet = self.spawn("kubelet", [
            str(self.cluster.bin / "kubelet"), f"--config={self._kubelet_config()}",
            f"--kubeconfig={self.cluster.pki}/{self.name}.kubeconfig", f"--hostname-override={self.name}",
            f"--node-ip={self.ip}", "--v=2",
        ])  # fmt: skip
        return self.kubelet

    def stop_kubelet(self, sig: int = signal.SIGTERM) -> int | None:
        assert self.kubelet is not None
        code = self.kubelet.stop(sig)
        self.cluster.sandbox.processes.remove(self.kubelet)
        self.kubelet = None
        return code

    def wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            node = self.cluster.get_json("node", self.name, check=False)
            conds = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        wait_until(f"node {self.name} Ready", ready, timeout)

    # --- use ------------------------------------------------------------------------

    def get(self) -> Any:
        """The Node object."""
        return self.cluster.get_json("node", self.name)

    def label(self, labels: Mapping[str, str | None]) -> None:
        """Set the node's labels (a pool, say); None removes one."""
        args = [f"{k}-" if v is None else f"{k}={v}" for k, v in labels.items()]
        self.cluster.kubectl("label", "node", self.name, "--overwrite", *args)

    def resource(self, field: str, resource: str) -> str | None:
        """``status.capacity`` or ``status.allocatable`` of ``resource`` (None: absent)."""
        value: str | None = self.get()["status"].get(field, {}).get(resource)
        return value

    def wait_resource(self, resource: str, value: str, timeout: float = 120, field: str = "allocatable") -> float:
        """Wait until the node's ``field`` of ``resource`` reads ``value``; seconds it took.
        The kubelet publishes node status every 10 s (nodeStatusUpdateFrequency), so this
        can lag the plugin's registration, and the plugin pod's Ready, by that much."""
        start = time.monotonic()
        wait_until(
            f"node {self.name} {field} {resource}={value}",
            lambda: self.resource(field, resource) == value or None,
            timeout,
        )
        return time.monotonic() - start

    def remove_cgroups(self, timeout: float = 60) -> None:
        cgroups.remove_tree(self.cgroup_root, timeout)
