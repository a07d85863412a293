"""The machine a run happened on, so that a reader can weigh the numbers."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        return "not installed"
    try:
        out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.strip().removeprefix("go version ")


def _pkg(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def bench_build(binary: Path) -> dict[str, Any]:
    try:
        out = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=30, check=False)
        info: dict[str, Any] = json.loads(out.stdout)
        return info
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def quick_build(binary: Path) -> bool:
    """Whether ``tools/build-kubelet-bench.sh --quick`` built this binary (without the
    compiler's optimizations, for the demo): Go records the -gcflags in the binary."""
    try:
        out = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split()[:2] == ["build", '-gcflags="all=-N'] for line in out.splitlines())


NOTED_MODULES = ("google.golang.org/grpc", "k8s.io/kubelet", "k8s.io/dynamic-resource-allocation")


def go_binary(binary: Path | None) -> dict[str, Any]:
    """What a Go binary says it was built from (``go version -m``): Go release, module deps."""
    if binary is None:
        return {}
    info: dict[str, Any] = {"path": str(binary)}
    try:
        info["sha256"] = hashlib.sha256(binary.read_bytes()).hexdigest()
        out = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return info
    for line in out.splitlines():
        parts = line.split()
        if line.startswith(str(binary)) and len(parts) > 1:
            info["go_version"] = parts[-1]
        elif len(parts) >= 3 and parts[0] in ("mod", "dep") and parts[1] in NOTED_MODULES:
            info[parts[1]] = parts[2]
        elif len(parts) >= 2 and parts[0] == "path":
            info["main"] = parts[1]  # the main package: which program this is
        elif len(parts) >= 2 and parts[0] == "build" and parts[1].startswith("vcs.revision="):
            info["revision"] = parts[1].split("=", 1)[1]
    return info


def git_revision(repo: Path) -> str:
    """HEAD of the repository, with "+dirty.<hash>" when app/ differs from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        diff = subprocess.run(
            ["git", "-C", str(repo), "diff", "HEAD", "--", "app"], capture_output=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    # Uncommitted edits under app/ are named by a hash of their diff, so two readings differ
    # whenever the code the daemons run differs.
    return (head or "unknown") + (f"+dirty.{hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")


def app_differs(repo: Path, start: str, end: str) -> bool:
    """Whether app/ differs between two readings of git_revision (commits may have landed
    outside app/ meanwhile); unknown counts as different."""
    if start == end:
        return False
    if "+dirty" in start or "+dirty" in end or "unknown" in (start, end):
        return True
    try:
        diff = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", start, end, "--", "app"], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return diff.returncode != 0


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def describe(bench_binary: Path, gdp: Path | None = None, dra_example: Path | None = None) -> dict[str, Any]:
    uname = os.uname()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _mem_total_gib(),
        "kernel": f"{uname.sysname} {uname.release} {uname.machine}",
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "go": _go_version(),
        "grpcio": _pkg("grpcio"),
        "protobuf": _pkg("protobuf"),
        "ate_devplugin": _pkg("ate-devplugin"),
        "git_revision": git_revision(Path(__file__).resolve().parents[1]),
        "kubelet_bench": bench_build(bench_binary),
        "generic_device_plugin": go_binary(gdp),
        "dra_example_driver": go_binary(dra_example),
        "loadavg_at_start": loadavg(),
    }
