"""The two images the node runs, as archives containerd imports (no registry is reachable).

* the project's image, built once per test session by the ``image`` fixture
  (tools/build-image.sh), saved as ``localhost/ate-devplugin:e2e``;
* the pod sandbox image ``localhost/pause:e2e``: the ``pause`` binary tools/build-k8s.sh
  compiles from the Kubernetes module's pause.c, alone in an image ``FROM scratch``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.image import buildah

PLUGIN_IMAGE = "localhost/ate-devplugin:e2e"
PAUSE_IMAGE = "localhost/pause:e2e"


def save_plugin_image(built: str, dest: Path) -> Path:
    """Write the built image ``built`` to ``dest`` as a docker-archive tagged PLUGIN_IMAGE."""
    dest.unlink(missing_ok=True)
    buildah("push", "--quiet", built, f"docker-archive:{dest}:{PLUGIN_IMAGE}", timeout=600)
    return dest


def save_pause_image(pause_binary: Path, dest: Path) -> Path:
    """Make the sandbox image from ``pause_binary`` and write it to ``dest``."""
    dest.unlink(missing_ok=True)
    local = f"{PAUSE_IMAGE}-{os.getpid()}"  # one name per session: runs side by side never clash
    container = buildah("from", "scratch").stdout.strip()
    try:
        buildah("copy", container, str(pause_binary), "/pause")
        buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
        buildah("commit", "--quiet", container, local)
    finally:
        buildah("rm", container, check=False)
    try:
        buildah("push", "--quiet", local, f"docker-archive:{dest}:{PAUSE_IMAGE}")
    finally:
        buildah("rmi", local, check=False)
    return dest
