"""Fixtures shared by every test folder.

Kubelet bench (tests/harness/kubelet.py):

* ``kubelet_version``: parametrizes a test over every pinned release ("1.35", "1.37").
  A release whose bench binary is not built is skipped, or fails under CI
  (tests/harness/require.py).
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
  Debian's buildah, podman and debootstrap; a missing one skips, or fails under CI.
  ``KEEP_TEST_IMAGE=1`` keeps it afterwards (localhost/ate-devplugin:test-<pid>);
  ``REUSE_TEST_IMAGE=<name>`` uses that image, built before with tools/build-image.sh,
  instead of building one (and keeps it).

Logs of the bench, the stubs and the daemons are printed when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.harness import early
from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.devices import make_device_root
from tests.harness.faults import SpawnDaemon
from tests.harness.image import ARM64_BUILD, REPO, TEST_IMAGE, BuiltImage, buildah
from tests.harness.kubelet import KNOWN_VERSIONS, GoStubPlugin, KubeletBench, Namespace
from tests.harness.outcome import CALL_FAILED, print_logs_if_failed
from tests.harness.require import missing_tool, require_kubelet_bench


def pytest_collection_finish(session: pytest.Session) -> None:
    """The arm64 image's build (minutes of emulation on one core) starts now, beside the
    tests before tests/image, when they are to run and this machine can build it."""
    arm64 = any(item.nodeid.startswith("tests/image/test_image_arm64.py") for item in session.items)
    tools = all(shutil.which(t) for t in ("buildah", "podman", "debootstrap", "qemu-aarch64-static"))
    if arm64 and tools and os.geteuid() == 0 and not session.config.option.collectonly:
        early.start("arm64-image", *ARM64_BUILD)


def pytest_sessionfinish(session: pytest.Session) -> None:
    early.stop_all()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The 30 slowest modules (set-up, call and tear-down of their tests), beside pytest's
    30 slowest tests (--durations): where the suite's time goes, in every run's log."""
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                module = report.nodeid.split("::", 1)[0]
                spent[module] = spent.get(module, 0.0) + report.duration
    if spent:
        terminalreporter.write_sep("=", "slowest 30 modules")
        for module, seconds in sorted(spent.items(), key=lambda item: -item[1])[:30]:
            terminalreporter.write_line(f"{seconds:9.1f}s {module}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    return report


@pytest.fixture(params=KNOWN_VERSIONS, ids=[f"k8s{v}" for v in KNOWN_VERSIONS])
def kubelet_version(request: pytest.FixtureRequest) -> str:
    version: str = request.param
    require_kubelet_bench(version)
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
        print_logs_if_failed(request, [bench])


Peer = TypeVar("Peer", GoStubPlugin, DevicePluginDaemon)


def _made_in_test(
    request: pytest.FixtureRequest, build: Callable[..., Peer], close: Callable[[Peer], object], tail: int
) -> Iterator[Callable[..., Peer]]:
    """The body of a factory fixture: ``build(n, *args, **kwargs)`` makes the n-th peer,
    started unless ``start=False``; after the test each is closed, its log printed on failure."""
    made: list[Peer] = []

    def make(*args: Any, start: bool = True, **kwargs: Any) -> Peer:
        peer = build(len(made), *args, **kwargs)
        made.append(peer)
        return peer.start() if start else peer

    try:
        yield make
    finally:
        for peer in made:
            close(peer)
        print_logs_if_failed(request, made, tail)


@pytest.fixture
def go_stub(
    kubelet_ns: Namespace, kubelet_version: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., GoStubPlugin]]:
    """``go_stub(resource, devices=N, **options)`` starts a registered Go stub plugin
    (options as for :class:`GoStubPlugin`; ``start=False`` only creates it)."""

    def build(n: int, resource: str, **options: Any) -> GoStubPlugin:
        return GoStubPlugin(kubelet_ns, kubelet_version, resource, **{"log_dir": tmp_path / "logs", **options})

    yield from _made_in_test(request, build, GoStubPlugin.stop, tail=20000)


@pytest.fixture
def device_root(tmp_path: Path) -> Path:
    return make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})


@pytest.fixture
def spawn_daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SpawnDaemon]:
    """``spawn_daemon(device_root, ns=..., config=None, env=None, args=(), start=True)``: our
    daemon anywhere; closed after the test, its log printed when the test failed."""

    def build(n: int, device_root: Path, **kwargs: Any) -> DevicePluginDaemon:
        return DevicePluginDaemon(device_root, tmp_path / f"daemon{n}", **kwargs)

    yield from _made_in_test(request, build, DevicePluginDaemon.close, tail=6000)


@pytest.fixture
def daemon(kubelet_ns: Namespace, device_root: Path, spawn_daemon: SpawnDaemon) -> MakeDaemon:
    """``daemon(config=None, env=None, start=True)``: our daemon in the bench's namespace."""

    def make(
        config: str | None = None, *, env: Mapping[str, str | None] | None = None, start: bool = True
    ) -> DevicePluginDaemon:
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
