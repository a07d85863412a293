"""node-feature-discovery, the real one (tools/build-nfd.sh): where its binaries are, and
its API's CRDs, read from the pinned module's deployment/ directory in the Go module cache
(the module tools/build-nfd.sh built from), not copied into this repository.

tests/e2e/test_nfd_labels.py runs nfd-master and nfd-worker beside a cluster; this module
only finds what they need.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL = "tools/build-nfd.sh"
MODULE = "sigs.k8s.io/node-feature-discovery"
MOD_DIR = REPO / "tools" / "nfd"
#: The CRDs of nfd.k8s-sigs.io (NodeFeature, NodeFeatureRule, NodeFeatureGroup), as
#: upstream's kustomize base (deployment/base/nfd-crds) applies them.
CRDS = Path("deployment/base/nfd-crds/nfd-api-crds.yaml")
BINARIES = ("nfd-master", "nfd-worker")


def bin_dir() -> Path:
    """``$NFD_BIN_DIR`` or build/bin."""
    return Path(os.environ.get("NFD_BIN_DIR", REPO / "build" / "bin"))


def binary(name: str) -> Path | None:
    path = bin_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def module_dir() -> Path | None:
    """The pinned node-feature-discovery module's directory in the Go module cache (filled
    by tools/build-nfd.sh), or None when go or the module is not there."""
    if shutil.which("go") is None:
        return None
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly", "GOPROXY": "off"}
    out = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", MODULE], cwd=MOD_DIR, env=env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    path = Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    return path if path is not None and (path / CRDS).is_file() else None


def version() -> str:
    """The pinned version, as tools/nfd/go.mod requires it."""
    for line in (MOD_DIR / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == MODULE:
            return words[1]
    raise RuntimeError(f"{MODULE} is not required in {MOD_DIR / 'go.mod'}")


def missing() -> str | None:
    """Why nfd-master and nfd-worker cannot run here (None: they can)."""
    for name in BINARIES:
        if binary(name) is None:
            return f"{name} not built: run {INSTALL}"
    if module_dir() is None:
        return f"{MODULE} not in the Go module cache (its CRDs are read there): run {INSTALL}"
    return None
