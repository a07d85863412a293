"""The e2e suite's clusters: each kind (release, runtime, number of nodes, cgroup version)
brought up once, on first use, and ended at the session's end, with the checks that
nothing of them is left on the host (see conftest.py). Every node imports three images:
the project's, the pause image and the VMM image of tests/e2e/vmm.py (built once, when
the first cluster comes up; ``REUSE_VMM_IMAGE=<name>`` uses one built before instead)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e import cgroups
from tests.e2e.cluster import (
    CLIENT_RELEASE,
    CNI_BIN_DIR,
    CONTAINERD2,
    CONTAINERD2_BINARIES,
    DEBIAN_CONTAINERD,
    DEFAULT_RELEASE,
    NODES_BRIDGE,
    POD_BRIDGE,
    SERVER_BINARIES,
    Cluster,
    containerd2_bin_dir,
    k8s_bin_dir,
)
from tests.e2e.images import save_pause_image, save_plugin_image
from tests.e2e.sandbox import Sandbox, children
from tests.e2e.vmm import VMM_IMAGE, build_guest, build_image, save_image
from tests.harness.chart import helm_path
from tests.harness.image import BuiltImage, buildah
from tests.harness.require import in_ci

HOST_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/log/containers", "/var/log/pods", "/run/cdi", "/etc/cdi")


def required() -> bool:
    return in_ci() or os.environ.get("E2E_REQUIRED") == "1"


def missing_prerequisite(release: str = DEFAULT_RELEASE, runtime: str = DEBIAN_CONTAINERD) -> str | None:
    if os.geteuid() != 0:
        return "the e2e cluster needs root (namespaces, mounts, containerd)"
    if not os.path.exists("/dev/kvm"):
        return "no /dev/kvm on this machine"
    tools = {
        "unshare": "util-linux", "nsenter": "util-linux", "ip": "iproute2", "openssl": "openssl",
        "containerd": "containerd", "ctr": "containerd", "runc": "runc", "etcd": "etcd-server",
        "as": "binutils", "ld": "binutils",  # the VMM image's guest (tests/e2e/guest)
    }  # fmt: skip
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install -y {package} (or tools/setup.sh test)"
    if not os.access(f"{CNI_BIN_DIR}/bridge", os.X_OK):
        return "no CNI plugins: apt-get install -y containernetworking-plugins"
    binaries = [k8s_bin_dir() / release / name for name in SERVER_BINARIES]
    for path in [*binaries, k8s_bin_dir() / CLIENT_RELEASE / "kubectl"]:
        if not os.access(path, os.X_OK):
            return f"{path} not built: run tools/build-k8s.sh"
    for major in ("v3", "v4"):
        if helm_path(major) is None:
            return f"helm {major} not built: run tools/build-helm.sh"
    if runtime == CONTAINERD2:
        for name in CONTAINERD2_BINARIES:
            if not os.access(containerd2_bin_dir() / name, os.X_OK):
                return f"{containerd2_bin_dir() / name} not built: run tools/build-containerd.sh"
    return None


def host_state() -> dict[str, object]:
    """What of the host a cluster could leave changed: paths the kubelet and containerd
    hard-code, the clusters' links in the host's network namespace, their tmpfs mounts
    (source ``ate-e2e``) in the host's mount table, the controllers enabled at the top of
    the unified cgroup hierarchy (cgroup v2 nodes enable theirs) and the cgroups there."""
    state: dict[str, object] = {path: os.path.exists(path) for path in HOST_PATHS}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    state["links"] = sorted(n for n in names if n in (NODES_BRIDGE, POD_BRIDGE) or n.startswith("e2e-"))
    with open("/proc/self/mountinfo") as mountinfo:
        state["mounts"] = sorted(line.split()[4] for line in mountinfo if " - tmpfs ate-e2e " in line)
    state["cgroup2 subtree_control"], state["cgroup2 top cgroups"] = cgroups.top_state()
    return state


def check_host(before: dict[str, object]) -> None:
    after = host_state()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"the host changed (before, after): {changed}"


@dataclass
class Clusters:
    """Each kind of cluster, brought up once per session on first use, ended at its end."""

    image: BuiltImage
    tmp_path_factory: pytest.TempPathFactory
    before: dict[str, object] = field(default_factory=host_state)
    up: dict[tuple[str, str, int, int], Cluster] = field(default_factory=dict)
    failed: dict[tuple[str, str, int, int], str] = field(default_factory=dict)
    vmm_archive: Path | None = None
    vmm_built: str = ""  # the local name of the VMM image this session built (removed at the end)

    def get(
        self, release: str = DEFAULT_RELEASE, runtime: str = DEBIAN_CONTAINERD, nodes: int = 1, cgroup: int = 1
    ) -> Cluster:
        key = (release, runtime, nodes, cgroup)
        if key in self.failed:  # once is enough: every later test of it fails at once
            pytest.fail(f"cluster {key} did not come up: {self.failed[key]}", pytrace=False)
        if key not in self.up:
            why = missing_prerequisite(release, runtime)
            if why:
                if required():
                    pytest.fail(f"{why} (CI=true or E2E_REQUIRED=1)")
                pytest.skip(why)
            try:
                self.up[key] = self._boot(release, runtime, nodes, cgroup)
            except Exception as exc:
                self.failed[key] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
                raise
        return self.up[key]

    def _boot(self, release: str, runtime: str, nodes: int, cgroup: int) -> Cluster:
        workdir = self.tmp_path_factory.mktemp(f"e2e-{release}-{runtime}-{nodes}-cgroup{cgroup}")
        images = [
            save_plugin_image(self.image.name, workdir / "ate-devplugin.tar"),
            save_pause_image(k8s_bin_dir() / release / "pause", workdir / "pause.tar"),
            self.vmm_image(),
        ]
        sandbox = Sandbox(workdir / "logs")
        containerd2 = containerd2_bin_dir() if runtime == CONTAINERD2 else None
        cluster = Cluster(sandbox, workdir, k8s_bin_dir(), images, runtime, containerd2, release=release, nodes=nodes,
                          cgroup=cgroup)  # fmt: skip
        try:
            sandbox.start()
            cluster.up()
        except BaseException:
            end(cluster)
            raise
        return cluster

    def vmm_image(self) -> Path:
        """The VMM image's archive, made once per session."""
        if self.vmm_archive is None:
            workdir = self.tmp_path_factory.mktemp("vmm")
            name = os.environ.get("REUSE_VMM_IMAGE", "")
            if not name:
                name = f"{VMM_IMAGE}-{os.getpid()}"  # one name per session: runs side by side never clash
                print(build_image(build_guest(workdir / "guest"), name))
                self.vmm_built = name
            self.vmm_archive = save_image(name, workdir / "vmm.tar")
        return self.vmm_archive

    def close(self) -> None:
        errors = []
        for cluster in self.up.values():
            try:
                end(cluster)
            except AssertionError as exc:
                errors.append(str(exc))
        self.up.clear()
        if self.vmm_built and os.environ.get("KEEP_TEST_IMAGE") != "1":
            buildah("rmi", self.vmm_built, check=False)
        check_host(self.before)
        assert not errors, "\n".join(errors)


def end(cluster: Cluster) -> None:
    """Close ``cluster`` and check that nothing of it is left: processes, cgroups."""
    sandbox = cluster.sandbox
    spawned = [p.popen.pid for p in sandbox.processes]
    init = sandbox.init_pid
    cluster.close()
    left = [pid for pid in [*spawned, init] if os.path.exists(f"/proc/{pid}")]
    left += [c for pid in spawned for c in children(pid)]
    assert not left, f"processes of cluster {cluster.key} still running: {left}"
    leftover = [path for node in cluster.nodes for path in cgroups.left(node.cgroup_root)]
    assert not leftover, f"cgroups left: {leftover}"
