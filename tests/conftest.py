"""Fixtures shared by every test folder.

Kubelet bench (tests/harness/kubelet.py):

* ``kubelet_version``: parametrizes a test over every pinned release ("1.35", "1.37").
  A release whose bench binary is not built is skipped, or fails when
  ``KUBELET_BENCH_REQUIRED=1`` (set that in CI after tools/build-kubelet-bench.sh).
* ``kubelet_ns``: a fresh private mount namespace (tmpfs over /var/lib).
* ``kubelet``: a :class:`KubeletBench` of that release in that namespace, manager started.
* ``go_stub``: factory starting the kubelet's Go stub device plugin in the namespace.

Our daemon (tests/harness/daemon.py):

* ``device_root``: a device root holding a real ``kvm`` character node.
* ``daemon``: factory starting our daemon in the bench's namespace.

Container image (tests/harness/image.py):

* ``image``: the project's image, built once per session from the Dockerfile with
  ``tools/build-image.sh`` (buildah, chroot isolation, vfs storage; the Debian base is made
  with debootstrap when it cannot be pulled), for tests/image and tests/e2e. Needs root and
  Debian's buildah, podman and debootstrap; a missing one skips, or fails when
  ``IMAGE_TOOLS_REQUIRED=1`` (CI). ``KEEP_TEST_IMAGE=1`` keeps it afterwards
  (localhost/ate-devplugin:test-<pid>); ``REUSE_TEST_IMAGE=<name>`` uses that image, built
  before with tools/build-image.sh, instead of building one (and keeps it).

Logs of the bench, the stubs and the daemons are printed when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.daemon import DevicePluginDaemon, MakeDaemon
from harness.devices import make_device_root
from harness.faults import SpawnDaemon
from harness.image import REPO, TEST_IMAGE, BuiltImage, buildah, missing_tool
from harness.kubelet import (
    KNOWN_VERSIONS,
    GoStubPlugin,
    KubeletBench,
    Namespace,
    bench_binary,
    missing_prerequisites,
)
from harness.outcome import CALL_FAILED, call_failed


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    return report


@pytest.fixture(params=KNOWN_VERSIONS, ids=[f"k8s{v}" for v in KNOWN_VERSIONS])
def kubelet_version(request: pytest.FixtureRequest) -> str:
    version: str = request.param
    why = missing_prerequisites()
    if why:
        pytest.skip(why)
    if not os.access(bench_binary(version), os.X_OK):
        msg = f"kubelet bench {version} not built: run tools/build-kubelet-bench.sh"
        if os.environ.get("KUBELET_BENCH_REQUIRED", "") not in ("", "0"):
            pytest.fail(msg)
        pytest.skip(msg)
    return version


@pytest.fixture
def kubelet_ns(kubelet_version: str) -> Iterator[Namespace]:
    with Namespace() as ns:
        yield ns


@pytest.fixture
def kubelet(
    kubelet_ns: Namespace, kubelet_version: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[KubeletBench]:
    bench = KubeletBench(kubelet_ns, kubelet_version, log_dir=tmp_path / "logs")
    try:
        bench.start()
        yield bench
    finally:
        bench.close()
        if call_failed(request):
            print(f"----- {bench.log_path} -----\n{bench.log_text()[-20000:]}")


@pytest.fixture
def go_stub(
    kubelet_ns: Namespace, kubelet_version: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., GoStubPlugin]]:
    """``go_stub(resource, devices=N, **options)`` starts a registered Go stub plugin
    (options as for :class:`GoStubPlugin`; ``start=False`` only creates it)."""
    stubs: list[GoStubPlugin] = []

    def make(resource: str, *, start: bool = True, **options: Any) -> GoStubPlugin:
        options.setdefault("log_dir", tmp_path / "logs")
        stub = GoStubPlugin(kubelet_ns, kubelet_version, resource, **options)
        stubs.append(stub)
        return stub.start() if start else stub

    try:
        yield make
    finally:
        for stub in stubs:
            stub.stop()
        if call_failed(request):
            for stub in stubs:
                print(f"----- {stub.log_path} -----\n{stub.log_text()[-20000:]}")


@pytest.fixture
def device_root(tmp_path: Path) -> Path:
    return make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})


@pytest.fixture
def spawn_daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SpawnDaemon]:
    """``spawn_daemon(device_root, ns=..., config=None, env=None, args=(), start=True)``: our
    daemon anywhere; closed after the test, its log printed when the test failed."""
    made: list[DevicePluginDaemon] = []

    def make(device_root: Path, *, start: bool = True, **kwargs: Any) -> DevicePluginDaemon:
        d = DevicePluginDaemon(device_root, tmp_path / f"daemon{len(made)}", **kwargs)
        made.append(d)
        return d.start() if start else d

    try:
        yield make
    finally:
        for d in made:
            d.close()
            if call_failed(request):
                print(f"----- {d.log_path} -----\n{d.log_text()[-6000:]}")


@pytest.fixture
def daemon(kubelet_ns: Namespace, device_root: Path, spawn_daemon: SpawnDaemon) -> MakeDaemon:
    """``daemon(config=None, env=None, start=True)``: our daemon in the bench's namespace."""

    def make(config: str | None = None, *, env: dict[str, str] | None = None, start: bool = True) -> DevicePluginDaemon:
        return spawn_daemon(device_root, ns=kubelet_ns, config=config, env=env, start=start)

    return make


@pytest.fixture(scope="session")
def image() -> Iterator[BuiltImage]:
    for tool in ("buildah", "podman", "debootstrap"):
        if shutil.which(tool) is None:
            missing_tool(tool, "apt-get install -y buildah podman debootstrap")
    if os.geteuid() != 0:
        missing_tool("root (buildah with chroot isolation and vfs storage)", "run the tests as root")
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip("no pyproject.toml yet: nothing to put in the image")
    reuse = os.environ.get("REUSE_TEST_IMAGE")
    if reuse:
        inspect = json.loads(buildah("inspect", "--type", "image", reuse).stdout)
        yield BuiltImage(reuse, inspect["OCIv1"], 0.0)
        return
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
