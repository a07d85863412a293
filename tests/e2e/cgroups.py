"""The nodes' cgroups, seen from the host: the v1 hierarchies and the unified (v2) one.

A node on cgroup v1 has its cgroup root in every v1 hierarchy the host mounts. A node on
cgroup v2 mounts the kernel's one cgroup2 hierarchy over ``/sys/fs/cgroup`` in its own
mount namespace (the host keeps v1: controllers the host's v1 hierarchies hold, cpu,
memory, pids and devices among them, are not available there; on these machines only
``hugetlb`` is), and the kubelet, containerd and runc there see a v2 host: runc guards
devices with its eBPF device filter. That node's cgroup root is in the unified hierarchy.

The host reaches the unified hierarchy where it mounts it (``/sys/fs/cgroup/unified`` on a
hybrid host) or, where it does not, through a process that holds a private mount of it
(``/proc/<pid>/root/sys/fs/cgroup``), so that nothing is mounted in the host's namespace.

A cgroup root under the unified hierarchy needs the kubelet's controllers that the kernel
offers there enabled in the top cgroup's ``cgroup.subtree_control`` (the kubelet checks
that its root has them; runc would enable them on its first container anyway). Those the
suite enabled are disabled again once no node's cgroup is left (:func:`release_controllers`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from tests.e2e.sandbox import die_with_parent

PREFIX = "ate-e2e-"
#: The controllers the kubelet uses on cgroup v2 (pkg/kubelet/cm/cgroup_v2_manager_linux.go,
#: getSupportedUnifiedControllers); it requires those of them the top cgroup offers.
KUBELET_CONTROLLERS = ("cpu", "cpuset", "memory", "hugetlb", "pids")

_holder: subprocess.Popen[bytes] | None = None
_enabled: set[str] = set()  # controllers this process enabled in the unified top cgroup


def _mounts() -> list[tuple[str, Path]]:
    """(file system type, mount point) of every cgroup mount in the host's mount namespace."""
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, Path(fields[4])))
    return found


def v1_hierarchies() -> list[Path]:
    return sorted(path for fstype, path in _mounts() if fstype == "cgroup" and (path / "cgroup.procs").exists())


def unified() -> Path:
    """The top of the unified hierarchy, as the host reaches it."""
    global _holder
    mounted = [path for fstype, path in _mounts() if fstype == "cgroup2"]
    if mounted:
        return mounted[0]
    if _holder is None or _holder.poll() is not None:
        _holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             "mount -t cgroup2 none /sys/fs/cgroup && echo ready && exec sleep infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=die_with_parent,
        )  # fmt: skip
        assert _holder.stdout is not None
        if _holder.stdout.readline().strip() != b"ready":
            raise OSError("cannot mount the cgroup2 hierarchy in a private mount namespace")
    return Path(f"/proc/{_holder.pid}/root/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """Every hierarchy a node's cgroups can be in: v1's and the unified one."""
    top = unified()
    return [*(h for h in v1_hierarchies() if h.resolve() != top.resolve()), top]


def make_root(root: str, version: int) -> None:
    """Make a node's cgroup root: in every v1 hierarchy (cpusets filled, an empty one takes
    no task), or in the unified one with the kubelet's controllers enabled above it."""
    if version == 1:
        for hierarchy in v1_hierarchies():
            path = hierarchy / root.lstrip("/")
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists():
                    (path / name).write_text((hierarchy / name).read_text())
        return
    top = unified()
    offered = set((top / "cgroup.controllers").read_text().split())
    on = set((top / "cgroup.subtree_control").read_text().split())
    for controller in sorted(offered & set(KUBELET_CONTROLLERS) - on):
        (top / "cgroup.subtree_control").write_text(f"+{controller}")
        _enabled.add(controller)
    (top / root.lstrip("/")).mkdir(exist_ok=True)


def remove_tree(root: str, timeout: float) -> None:
    """rmdir every cgroup under ``root``, deepest first, in every hierarchy (their processes
    are gone with the sandbox; a cgroup may stay busy for a moment after)."""
    deadline = time.monotonic() + timeout
    for hierarchy in hierarchies():
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


def left(root: str) -> list[str]:
    """What is left of a node's cgroup root, in any hierarchy."""
    return [str(h / root.lstrip("/")) for h in hierarchies() if (h / root.lstrip("/")).exists()]


def procs(root: str) -> set[int]:
    """The processes in the cgroups under ``root``, in any hierarchy (host PIDs)."""
    return {
        int(pid)
        for h in hierarchies()
        for f in (h / root.lstrip("/")).rglob("cgroup.procs")
        for pid in f.read_text().split()
    }


def remove_stale() -> None:
    """Cgroups of a run that was killed (SIGKILL leaves no time to clean up): its
    processes died with its sandbox, its empty cgroups stay until removed here."""
    for top in {p.name for h in hierarchies() for p in h.glob(f"{PREFIX}*")}:
        pid = top.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            remove_tree(f"/{top}", timeout=10)


def release_controllers() -> None:
    """Disable in the unified top cgroup what :func:`make_root` enabled, once no node's
    cgroup is left there (a controller still enabled below cannot be, and stays)."""
    top = unified()
    if not _enabled or list(top.glob(f"{PREFIX}*")):
        return
    for controller in sorted(_enabled):
        with contextlib.suppress(OSError):
            (top / "cgroup.subtree_control").write_text(f"-{controller}")
    _enabled.clear()


def top_state() -> tuple[str, list[str]]:
    """The unified top cgroup's ``cgroup.subtree_control`` and the cgroups right under it:
    what the host checks is unchanged after the clusters."""
    top = unified()
    return (top / "cgroup.subtree_control").read_text().strip(), sorted(p.name for p in top.iterdir() if p.is_dir())
