"""Fixtures of the end-to-end suite: a real one-node cluster, and the user's helm.

``cluster`` runs Debian's containerd 1.6; ``cluster_containerd2`` (with its helm,
``helm_containerd2``) is a second cluster on containerd 2 (CDI), booted only when a test
asks for it. Each (session) builds the two images into archives (the project's image comes from
the session's ``image`` fixture, shared with tests/image), starts a :class:`Sandbox` and
the :class:`Cluster` in it, and ends both in every outcome: on failure, on Ctrl-C (pytest
runs fixture finalizers) and, through PR_SET_PDEATHSIG, even when the test process is
killed. After the cluster is gone it checks that the host is as it was: no
/var/lib/kubelet, /run/containerd or /var/log/containers that was not there before, no
bridge in the host's network namespace, no process of the cluster left, no cgroup of it.

Needs root, util-linux (unshare, nsenter), /dev/kvm, Debian's containerd, runc,
etcd-server and containernetworking-plugins (tools/setup.sh test installs them), the
Kubernetes binaries (tools/build-k8s.sh), helm v3 and v4 (tools/build-helm.sh),
Debian's docker-registry for the user path's registry and, for the second cluster,
containerd 2 (tools/build-containerd.sh). What is
missing skips the suite, or fails it when ``CI=true`` or ``E2E_REQUIRED=1``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import BRIDGE, CNI_BIN_DIR, CONTAINERD2, CONTAINERD2_BINARIES, DEBIAN_CONTAINERD, Cluster
from tests.e2e.images import save_pause_image, save_plugin_image
from tests.e2e.registry import INSTALL as REGISTRY_INSTALL
from tests.e2e.registry import Registry
from tests.e2e.sandbox import Sandbox, children
from tests.e2e.userpath import Helm
from tests.harness.chart import helm_path
from tests.harness.image import BuiltImage
from tests.harness.require import in_ci

REPO = Path(__file__).resolve().parents[2]
K8S_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "pause")
HOST_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/log/containers", "/var/log/pods", "/run/cdi", "/etc/cdi")


def k8s_bin_dir() -> Path:
    env = os.environ.get("K8S_BIN_DIR")
    return Path(env) if env else REPO / "build" / "k8s"


def containerd2_bin_dir() -> Path:
    env = os.environ.get("CONTAINERD2_BIN_DIR")
    return Path(env) if env else REPO / "build" / "containerd2"


def required() -> bool:
    return in_ci() or os.environ.get("E2E_REQUIRED") == "1"


def missing_prerequisite(runtime: str = DEBIAN_CONTAINERD) -> str | None:
    if os.geteuid() != 0:
        return "the e2e cluster needs root (namespaces, mounts, containerd)"
    if not os.path.exists("/dev/kvm"):
        return "no /dev/kvm on this machine"
    tools = {
        "unshare": "util-linux", "nsenter": "util-linux", "ip": "iproute2", "openssl": "openssl",
        "containerd": "containerd", "ctr": "containerd", "runc": "runc", "etcd": "etcd-server",
    }  # fmt: skip
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install -y {package} (or tools/setup.sh test)"
    if not os.access(f"{CNI_BIN_DIR}/bridge", os.X_OK):
        return "no CNI plugins: apt-get install -y containernetworking-plugins"
    for name in K8S_BINARIES:
        if not os.access(k8s_bin_dir() / name, os.X_OK):
            return f"{k8s_bin_dir() / name} not built: run tools/build-k8s.sh"
    for major in ("v3", "v4"):
        if helm_path(major) is None:
            return f"helm {major} not built: run tools/build-helm.sh"
    if runtime == CONTAINERD2:
        for name in CONTAINERD2_BINARIES:
            if not os.access(containerd2_bin_dir() / name, os.X_OK):
                return f"{containerd2_bin_dir() / name} not built: run tools/build-containerd.sh"
    return None


def host_state() -> dict[str, bool]:
    state = {path: os.path.exists(path) for path in HOST_PATHS}
    state[f"bridge {BRIDGE}"] = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0
    return state


@pytest.fixture(scope="session")
def cluster(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with booted(DEBIAN_CONTAINERD, image, tmp_path_factory) as node:
        yield node


@pytest.fixture(scope="session")
def cluster_containerd2(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The same one-node cluster on containerd 2: CDI specs in its /var/run/cdi are used."""
    with booted(CONTAINERD2, image, tmp_path_factory) as node:
        yield node


@contextlib.contextmanager
def booted(runtime: str, image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = missing_prerequisite(runtime)
    if why:
        if required():
            pytest.fail(f"{why} (CI=true or E2E_REQUIRED=1)")
        pytest.skip(why)
    before = host_state()
    workdir = tmp_path_factory.mktemp(f"e2e-{runtime}")
    images = [
        save_plugin_image(image.name, workdir / "ate-devplugin.tar"),
        save_pause_image(k8s_bin_dir() / "pause", workdir / "pause.tar"),
    ]
    sandbox = Sandbox(workdir / "logs")
    containerd2 = containerd2_bin_dir() if runtime == CONTAINERD2 else None
    node = Cluster(sandbox, workdir, k8s_bin_dir(), images, runtime, containerd2)
    try:
        sandbox.start()
        node.up()
        yield node
    finally:
        spawned = [p.popen.pid for p in sandbox.processes]
        init = sandbox.init_pid
        node.close()
        left = [pid for pid in [*spawned, init] if os.path.exists(f"/proc/{pid}")]
        left += [c for pid in spawned for c in children(pid)]
        after = host_state()
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert not left, f"processes of the cluster still running: {left}"
        assert not changed, f"the host changed (before, after): {changed}"
        leftover = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{node.cgroup_root.lstrip('/')}")]
        assert not leftover, f"cgroups left: {leftover}"


def make_helm(major: str, cluster: Cluster) -> Helm:
    path = helm_path(major)
    assert path is not None, f"helm {major} not built"
    return Helm(major, path, cluster)


@pytest.fixture(scope="session")
def registry(cluster: Cluster) -> Iterator[Registry]:
    """The OCI registry of tests/e2e/registry.py in the cluster's sandbox, known to its
    containerd; the user path publishes the release there."""
    if shutil.which("docker-registry") is None:
        why = f"no docker-registry: {REGISTRY_INSTALL} (or tools/setup.sh test)"
        if required():
            pytest.fail(f"{why} (CI=true or E2E_REQUIRED=1)")
        pytest.skip(why)
    registry = Registry(cluster.sandbox, cluster.dir / "registry")
    registry.start()
    try:
        registry.configure_containerd(cluster.registry_hosts)
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def helm(cluster: Cluster) -> Helm:
    """helm v3: the one the scenarios after the install use."""
    return make_helm("v3", cluster)


@pytest.fixture(scope="session")
def helm_v4(cluster: Cluster) -> Helm:
    return make_helm("v4", cluster)


@pytest.fixture(scope="session")
def helm_containerd2(cluster_containerd2: Cluster) -> Helm:
    """helm v3 on the containerd 2 cluster."""
    return make_helm("v3", cluster_containerd2)
