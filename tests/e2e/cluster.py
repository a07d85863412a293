"""A real one-node Kubernetes cluster inside a :class:`~e2e.sandbox.Sandbox`.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (runc, the CNI
bridge plugin) and the kubelet, as a node of a small cluster runs them: certificates from
one CA, RBAC and node authorization, no privileged pods. No kube-proxy and no DNS: the
tests reach pods by their IPs, from inside the sandbox. Debian's containerd, runc, etcd
and CNI plugins; the Kubernetes binaries from tools/build-k8s.sh.

Two things of this kind of host are handled here, both found bringing the node up:

* root may lack CAP_SYS_RESOURCE: runc then cannot set the kubelet's ``oom_score_adj``
  of -998 for pod sandboxes and every pod fails (``can't get final child's PID from pipe:
  EOF``). containerd's ``restrict_oom_score_adj`` clamps the score instead.
* the host runs cgroup v1: kubelet 1.35 refuses it unless ``failCgroupV1: false``.

The pods' cgroups go under a cgroup root of this cluster's own (``/ate-e2e-<pid>`` in
every v1 hierarchy, ``/ate-e2e-<pid>-<runtime>`` for a second runtime), removed by
:meth:`Cluster.close`, so two runs, or two clusters of one run, never share one.

Two container runtimes (``Cluster(runtime=...)``): Debian's containerd 1.6 (the default,
as the user's node most likely has), or containerd 2 built by tools/build-containerd.sh,
the one with CDI: it resolves CDI device names against the specs in the sandbox's
``/var/run/cdi``. Both run pods with Debian's runc.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.e2e.sandbox import Process, Sandbox, SandboxError

T = TypeVar("T")

NODE = "e2e-node"
NODE_IP = "10.88.0.1"  # on the sandbox's bridge: the kubelet's node IP
POD_CIDR = "10.88.0.0/16"
SERVICE_CIDR = "10.96.0.0/24"
BRIDGE = "cni-e2e0"
API_PORT_ON_BRIDGE = 6443
API = f"https://127.0.0.1:{API_PORT_ON_BRIDGE}"
PAUSE_IMAGE = "localhost/pause:e2e"
CNI_BIN_DIR = "/usr/lib/cni"
CGROUP_FS = Path("/sys/fs/cgroup")
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The container runtimes a cluster can run.
DEBIAN_CONTAINERD = "containerd"  # Debian's containerd 1.6, on PATH: no CDI
CONTAINERD2 = "containerd2"  # containerd 2 from build/containerd2: CDI
RUNTIMES = (DEBIAN_CONTAINERD, CONTAINERD2)
CONTAINERD2_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
# Where containerd 2 reads CDI specs: only the sandbox's /var/run/cdi (a tmpfs over /run),
# not the host's /etc/cdi, so nothing of the host's reaches the cluster.
CDI_SPEC_DIR = "/var/run/cdi"


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


class Cluster:
    """The node and its control plane; :meth:`up` starts them, :meth:`close` ends them."""

    def __init__(
        self,
        sandbox: Sandbox,
        workdir: Path,
        k8s_bin: Path,
        images: Sequence[Path],
        runtime: str = DEBIAN_CONTAINERD,
        containerd2_bin: Path | None = None,
    ) -> None:
        if runtime not in RUNTIMES or (runtime == CONTAINERD2) != (containerd2_bin is not None):
            raise ValueError(f"runtime {runtime!r} (one of {RUNTIMES}; {CONTAINERD2} with its binaries' directory)")
        self.sandbox = sandbox
        self.dir = workdir
        self.bin = k8s_bin
        self.images = list(images)
        self.runtime = runtime
        self.containerd2_bin = containerd2_bin
        self.pki = workdir / "pki"
        self.kubeconfig = self.pki / "admin.kubeconfig"
        self.containerd_sock = "/run/containerd/containerd.sock"
        # The CRI plugin's registry config_path: <host>/hosts.toml per registry (tests/e2e/registry.py).
        self.registry_hosts = workdir / "containerd" / "certs.d"
        suffix = "" if runtime == DEBIAN_CONTAINERD else f"-{runtime}"
        self.cgroup_root = f"/ate-e2e-{os.getpid()}{suffix}"
        # Device nodes owned by the pod's user: on for containerd 1.6, the setting the
        # user's path needs there; off for containerd 2, where a CDI spec gives the mode.
        self.device_ownership = runtime == DEBIAN_CONTAINERD
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{k8s_bin}:{os.environ['PATH']}"}

    # --- bring-up -------------------------------------------------------------------

    def up(self) -> None:
        start = time.monotonic()
        for d in ("pki", "cni/net.d", "containerd/certs.d", "etcd", "kubelet"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self._certificates()
        self._network()
        self.start_containerd()
        for archive in self.images:
            self.ctr("images", "import", str(archive), timeout=600)
        self._control_plane()
        self._make_cgroup_root()
        self.start_kubelet()
        self.wait_node_ready()
        print(f"cluster up in {time.monotonic() - start:.1f}s (kubelet {self.version()})")

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.pki, check=True, capture_output=True, timeout=60)

    def _certificates(self) -> None:
        """One CA (EC P-256 keys: fast to make); client and serving certificates; kubeconfigs."""
        if (self.pki / "ca.crt").exists():
            return
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                      "-subj", "/CN=ate-e2e-ca")  # fmt: skip
        certs = {  # name: (subject, subjectAltName or "" for a client certificate)
            "apiserver": ("/CN=kube-apiserver",
                          f"DNS:localhost,DNS:kubernetes.default,IP:127.0.0.1,IP:{NODE_IP},IP:10.96.0.1"),
            "apiserver-kubelet-client": ("/CN=kube-apiserver-kubelet-client", ""),
            "admin": ("/O=system:masters/CN=admin", ""),
            "controller-manager": ("/CN=system:kube-controller-manager", ""),
            "scheduler": ("/CN=system:kube-scheduler", ""),
            "kubelet": (f"/O=system:nodes/CN=system:node:{NODE}", ""),
            "kubelet-serving": (f"/O=system:nodes/CN=system:node:{NODE}", f"DNS:{NODE},IP:{NODE_IP}"),
        }  # fmt: skip
        for name, (subject, san) in certs.items():
            ext = self.pki / f"{name}.ext"
            usage = "serverAuth,clientAuth" if san else "clientAuth"
            ext.write_text(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else "")
            )
            self._openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
            self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                          "-days", "2", "-sha256", "-extfile", ext.name, "-out", f"{name}.crt")  # fmt: skip
        self._openssl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key")
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        for user in ("admin", "controller-manager", "scheduler", "kubelet"):
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
            (self.pki / f"{user}.kubeconfig").write_text(json.dumps(config))

    def _network(self) -> None:
        """The pods' bridge, in the sandbox: pods reach the bridge subnet and nothing else."""
        for cmd in (
            ["ip", "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{NODE_IP}/16", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            self.sandbox.run(cmd)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "e2e-pods",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "rangeStart": "10.88.0.10",
                                                            "gateway": NODE_IP}]],
                         "dataDir": str(self.dir / "cni" / "ipam")},
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
        BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self.registry_hosts}"
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
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['{CDI_SPEC_DIR}']
  device_ownership_from_security_context = {str(self.device_ownership).lower()}
  restrict_oom_score_adj = {str(lacks_cap_sys_resource()).lower()}
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{self.dir}/cni/net.d"
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "{self.registry_hosts}"
""")
        return path

    def _containerd_binary(self, name: str) -> str:
        return name if self.containerd2_bin is None else str(self.containerd2_bin / name)

    def start_containerd(self) -> None:
        # containerd finds its shim on PATH: containerd 2's own before Debian's.
        env = (
            None
            if self.containerd2_bin is None
            else {**os.environ, "PATH": f"{self.containerd2_bin}:{os.environ['PATH']}"}
        )
        self.containerd = self.sandbox.spawn(
            "containerd", [self._containerd_binary("containerd"), "--config", str(self._containerd_config())], env=env
        )
        wait_until("containerd", lambda: self.ctr("version", check=False).returncode == 0, 60)

    def restart_containerd(self, device_ownership: bool) -> None:
        """Restart containerd with ``device_ownership_from_security_context`` set as given.
        Running containers keep running (their shims outlive containerd)."""
        assert self.containerd is not None
        self.device_ownership = device_ownership
        self.containerd.stop()
        self.sandbox.processes.remove(self.containerd)
        self.start_containerd()

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [self._containerd_binary("ctr"), "--address", self.containerd_sock, "-n", "k8s.io", *args]
        return self.sandbox.run(argv, check=check, timeout=timeout)

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
            # All addresses of the sandbox's own network namespace: loopback, and the bridge,
            # where pods that call the API server (the DRA driver) reach it without kube-proxy.
            "--bind-address=0.0.0.0", f"--secure-port={API_PORT_ON_BRIDGE}", f"--advertise-address={NODE_IP}",
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

    def _make_cgroup_root(self) -> None:
        self.remove_stale_cgroups()
        for hierarchy in self._hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset takes no task
                if (path / name).exists():
                    (path / name).write_text((hierarchy / name).read_text())

    @staticmethod
    def _hierarchies() -> list[Path]:
        return [h for h in sorted(CGROUP_FS.iterdir()) if (h / "cgroup.procs").exists() and not h.is_symlink()]

    def _kubelet_config(self) -> Path:
        pki = self.pki
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,  # the host runs cgroup v1; kubelet >= 1.35 refuses it otherwise
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": f"{pki}/ca.crt"}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": f"{pki}/kubelet-serving.crt",
            "tlsPrivateKeyFile": f"{pki}/kubelet-serving.key",
            "resolvConf": "",  # no DNS for pods
            "imageGCHighThresholdPercent": 100,  # never remove the imported images
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        }  # fmt: skip
        path = self.dir / "kubelet" / "config.yaml"
        path.write_text(json.dumps(config))
        return path

    def start_kubelet(self) -> Process:
        self.kubelet = self.sandbox.spawn("kubelet", [
            str(self.bin / "kubelet"), f"--config={self._kubelet_config()}",
            f"--kubeconfig={self.pki}/kubelet.kubeconfig", f"--hostname-override={NODE}", f"--node-ip={NODE_IP}",
            "--v=2",
        ])  # fmt: skip
        return self.kubelet

    def stop_kubelet(self, sig: int = signal.SIGTERM) -> int | None:
        assert self.kubelet is not None
        code = self.kubelet.stop(sig)
        self.sandbox.processes.remove(self.kubelet)
        self.kubelet = None
        return code

    def wait_node_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            node = self.get_json("node", NODE, check=False)
            conds = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        wait_until(f"node {NODE} Ready", ready, timeout)

    # --- use ------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        out = self.sandbox.run([str(self.bin / "kubectl"), *args], stdin=stdin, check=check, timeout=timeout,
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

    def node_resource(self, field: str, resource: str) -> str | None:
        """``status.capacity`` or ``status.allocatable`` of ``resource`` on the node (None: absent)."""
        node = self.get_json("node", NODE)
        value: str | None = node["status"].get(field, {}).get(resource)
        return value

    def wait_node_resource(self, resource: str, value: str, timeout: float = 120, field: str = "allocatable") -> float:
        """Wait until the node's ``field`` of ``resource`` reads ``value``; seconds it took.
        The kubelet publishes node status every 10 s (nodeStatusUpdateFrequency), so this
        can lag the plugin's registration, and the plugin pod's Ready, by that much."""
        start = time.monotonic()
        wait_until(
            f"node {field} {resource}={value}",
            lambda: self.node_resource(field, resource) == value or None,
            timeout,
        )
        return time.monotonic() - start

    # --- teardown -------------------------------------------------------------------

    def close(self) -> None:
        """Stop the kubelet first (no pod restarted behind our back), then everything with
        the sandbox, then remove this cluster's cgroups."""
        with contextlib.suppress(Exception):
            if self.kubelet is not None:
                self.stop_kubelet()
        self.sandbox.close()
        self.remove_cgroups()

    @classmethod
    def remove_stale_cgroups(cls) -> None:
        """Cgroups of a run that was killed (SIGKILL leaves no time to clean up): its
        processes died with its sandbox, its empty cgroups stay until removed here."""
        for top in {p.name for h in cls._hierarchies() for p in h.glob("ate-e2e-*")}:
            pid = top.removeprefix("ate-e2e-").split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                cls.remove_cgroup_tree(f"/{top}", timeout=10)

    def remove_cgroups(self, timeout: float = 60) -> None:
        """rmdir every cgroup under this cluster's root, deepest first (their processes are
        gone with the sandbox; a cgroup may stay busy for a moment after)."""
        self.remove_cgroup_tree(self.cgroup_root, timeout)

    @classmethod
    def remove_cgroup_tree(cls, root: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for hierarchy in cls._hierarchies():
            top = hierarchy / root.lstrip("/")
            if not top.exists():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, top]:
                while True:
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() >= deadline:
                            raise
                        time.sleep(0.2)
