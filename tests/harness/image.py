"""Helpers shared by the image tests (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# One tag per test session, so that two runs side by side never remove each other's image.
TEST_IMAGE = f"localhost/ate-devplugin:test-{os.getpid()}"
ARM64_IMAGE = f"{TEST_IMAGE}-arm64"
# tests/image/test_image_arm64.py's build, which tests/conftest.py starts at collection.
ARM64_BUILD = (
    [str(REPO / "tools" / "build-image.sh")],
    {"IMAGE": ARM64_IMAGE, "ARCH": "arm64", "STORAGE_DRIVER": "vfs"},
)
STORAGE = ["--storage-driver", "vfs"]


def buildah(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["buildah", *STORAGE, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


@dataclass(frozen=True)
class BuiltImage:
    name: str
    config: dict[str, Any]  # buildah inspect's OCIv1 image config
    build_seconds: float


@dataclass(frozen=True)
class WorkingContainer:
    """A buildah working container of the image, and its root filesystem on the host."""

    name: str
    root: Path
