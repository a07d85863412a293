"""The arm64 image: built by tools/build-image.sh (ARCH=arm64) from a debootstrapped arm64
base under emulation (qemu-user-static through binfmt_misc), holding aarch64 wheels; the
daemon inside, run under emulation, prints its version, judges config files exactly as the
host's does, and runs with a device root answering /healthz and /metrics as the chart runs
it; tools/release.sh pushes both architectures as one manifest list to a real registry
(Debian's docker-registry, over TLS with a CA of its own), chart beside it.

The arm64 build costs about 4 minutes of emulation (docs/development.md): built once, started
at collection beside the tests before this module (tests/harness/early.py), it shares nothing
with the amd64 build but the Dockerfile, and runs where tests/image runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import early
from tests.harness.chart import helm_path
from tests.harness.devices import make_device_root
from tests.harness.image import ARM64_BUILD, ARM64_IMAGE, REPO, BuiltImage, buildah
from tests.harness.net import free_port, http_get
from tests.harness.require import missing_tool, require_tool
from tests.harness.wait import wait_until

EM_AARCH64 = 183  # e_machine of an aarch64 ELF file
# What `buildah run` writes to stderr after a command that exits non-zero.
BUILDAH_EXIT = re.compile(r"^(subprocess exited with status \d+|Error: exit status \d+)\n", re.MULTILINE)
CONFIG = "resources:\n  - name: ate.dev/kvm\n    devices: [/dev/kvm]\n    units: 16\n    permissions: rw\n"


def _project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


@pytest.fixture(scope="module")
def arm64_image() -> Iterator[BuiltImage]:
    for tool in ("buildah", "podman", "debootstrap"):
        require_tool(tool, "apt-get install -y buildah podman debootstrap")
    if not Path("/usr/bin/qemu-aarch64-static").exists():
        missing_tool("qemu-aarch64-static", "apt-get install -y qemu-user-static (or tools/setup.sh test)")
    if os.geteuid() != 0:
        missing_tool("root (binfmt_misc, buildah with chroot isolation)", "run the tests as root")
    code, output, elapsed = early.run("arm64-image", *ARM64_BUILD, timeout=5400)
    assert code == 0, f"arm64 image build failed:\n{output[-10000:]}"
    steps = [line for line in output.splitlines() if line.startswith("build-image.sh:")]
    print(f"\narm64 image built in {elapsed:.0f} s:", *steps, sep="\n")
    inspect = json.loads(buildah("inspect", "--type", "image", ARM64_IMAGE).stdout)
    yield BuiltImage(ARM64_IMAGE, inspect["OCIv1"], elapsed)
    if os.environ.get("KEEP_TEST_IMAGE") != "1":
        buildah("rmi", "--force", ARM64_IMAGE, check=False)


@pytest.fixture
def arm64_container(arm64_image: BuiltImage) -> Iterator[tuple[str, Path]]:
    name = buildah("from", "--pull=never", "--arch", "arm64", arm64_image.name).stdout.strip()
    try:
        yield name, Path(buildah("mount", name).stdout.strip())
    finally:
        buildah("rm", name, check=False)


def _run(
    container: str, *argv: str, volumes: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    args = ["run", "--isolation", "chroot", "--cap-drop", "ALL"]
    for v in volumes:
        args += ["-v", v]
    return buildah(*args, container, "--", *argv, timeout=timeout, check=False)


def test_arm64_image_config(arm64_image: BuiltImage, image: BuiltImage) -> None:
    """The same image as the host's, for arm64: its platform, its own base's name, and every
    other label, the entrypoint and the environment as the amd64 image has them."""
    config = arm64_image.config
    assert (config["os"], config["architecture"], config.get("variant")) == ("linux", "arm64", "v8")
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.base.name"] == "docker.io/arm64v8/debian:bookworm-slim"
    native = image.config["config"]
    for key in ("title", "version", "revision", "licenses", "description"):
        assert labels[f"org.opencontainers.image.{key}"] == native["Labels"][f"org.opencontainers.image.{key}"], key
    for key in ("Entrypoint", "Cmd", "Env", "ExposedPorts", "StopSignal"):
        assert config["config"].get(key) == native.get(key), key


def test_everything_compiled_in_it_is_aarch64(arm64_container: tuple[str, Path]) -> None:
    """pip ran under emulation and took the aarch64 wheels: every shared object of the venv
    (grpcio's, protobuf's, ...) and the interpreter are aarch64 ELF files."""
    _, root = arm64_container
    interpreters = [p for p in (root / "usr/bin").glob("python3*") if p.is_file() and not p.is_symlink()]
    objects = [*(root / "opt/ate-devplugin/lib").rglob("*.so"), *interpreters]
    assert interpreters, "no python3 in /usr/bin"
    assert any(p.name.startswith("cygrpc.") for p in objects), "grpcio's extension is missing"
    for so in objects:
        head = so.read_bytes()[:20]
        assert head[:4] == b"\x7fELF", so
        assert int.from_bytes(head[18:20], "little") == EM_AARCH64, f"{so}: not aarch64"


def test_version_under_emulation(arm64_container: tuple[str, Path]) -> None:
    container, _ = arm64_container
    machine = _run(container, "python3", "-c", "import platform; print(platform.machine())")
    assert machine.stdout.strip() == "aarch64", machine.stdout + machine.stderr
    out = _run(container, "ate-devplugin", "version")
    assert out.returncode == 0, out.stderr
    assert _project_version() in out.stdout
    print(f"\narm64 `ate-devplugin version`: {out.stdout.strip()}")


@pytest.mark.parametrize(
    ("config", "code"),
    [(CONFIG, 0), ((REPO / "docs/examples/config-mistakes.yaml").read_text(), 2)],
    ids=["good", "mistakes"],
)
def test_check_config_under_emulation_judges_as_the_host_does(
    arm64_container: tuple[str, Path], tmp_path: Path, config: str, code: int
) -> None:
    container, _ = arm64_container
    (tmp_path / "config.yaml").write_text(config)
    arm = _run(container, "ate-devplugin", "check-config", "/etc/ate-devplugin/config.yaml",
               volumes=(f"{tmp_path}:/etc/ate-devplugin:ro",))  # fmt: skip
    host = subprocess.run(
        [sys.executable, "-m", "ate_devplugin", "check-config", str(tmp_path / "config.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert arm.returncode == code, arm.stdout + arm.stderr

    def here(text: str) -> str:
        """As the host's daemon says it: its path for the file, without what buildah adds
        when the command exits non-zero."""
        return BUILDAH_EXIT.sub("", text).replace("/etc/ate-devplugin/", f"{tmp_path}/")

    assert (arm.returncode, here(arm.stdout), here(arm.stderr)) == (host.returncode, host.stdout, host.stderr)
    print(f"\narm64 `ate-devplugin check-config` ({code}):\n{arm.stdout}{arm.stderr}")


def test_the_daemon_runs_under_emulation(arm64_container: tuple[str, Path], tmp_path: Path) -> None:
    """`ate-devplugin run` with the chart's arguments, without capabilities: a device root
    holding a kvm node, /healthz 200 and the node present in /metrics; SIGTERM ends it with 0
    and its socket removed."""
    container, _ = arm64_container
    plugins, config = tmp_path / "device-plugins", tmp_path / "config"
    plugins.mkdir()
    config.mkdir()
    (config / "config.yaml").write_text(CONFIG)
    dev = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    port = free_port()
    proc = subprocess.Popen(
        ["buildah", "--storage-driver", "vfs", "run", "--isolation", "chroot", "--network", "host",
         "--cap-drop", "ALL",
         "-v", f"{plugins}:/var/lib/kubelet/device-plugins", "-v", f"{dev}:/host/dev:ro",
         "-v", f"{config}:/etc/ate-devplugin:ro", container, "--",
         "ate-devplugin", "run", "--config=/etc/ate-devplugin/config.yaml", "--device-root=/host/dev",
         "--plugin-dir=/var/lib/kubelet/device-plugins", f"--metrics-address=127.0.0.1:{port}",
         "--log-format=json", "--log-level=info"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"daemon exited with {proc.returncode}:\n{out}\n{err}")
            try:
                return http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200
            except OSError:
                return False

        started = time.monotonic()
        wait_until(healthy, 180, f"/healthz on 127.0.0.1:{port}", interval=0.5)
        print(f"\narm64 daemon answered /healthz {time.monotonic() - started:.1f} s after start")
        body = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        assert 'ate_devplugin_device_nodes_present{resource_name="ate.dev/kvm"} 1.0' in body
        # The daemon itself (the python under qemu), by its unique metrics address.
        (pid,) = [
            int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _cmdline_has(p, f"--metrics-address=127.0.0.1:{port}") and _is_python(p)
        ]  # fmt: skip
        os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"exit {proc.returncode} after SIGTERM:\n{out}\n{err}"
        assert not list(plugins.iterdir()), "sockets left behind after SIGTERM"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _cmdline_has(proc_dir: Path, arg: str) -> bool:
    try:
        return arg.encode() in (proc_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _is_python(proc_dir: Path) -> bool:
    """The emulated interpreter: qemu runs it, and /proc names qemu's or python's binary."""
    try:
        first = (proc_dir / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return b"python" in first or b"qemu" in first


# --- the release: one manifest list of both architectures ---------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Debian's docker-registry on 127.0.0.1 over TLS, its certificate from a CA of its own;
    yields its address and the CA (Go clients trust it through SSL_CERT_FILE)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        missing_tool("docker-registry", "apt-get install -y docker-registry (or tools/setup.sh test)")
    work = tmp_path / "registry"
    work.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=ate-test-ca")
    (work / "tls.ext").write_text(
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
    )
    openssl("req", "-new", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "tls.ext", "-out", "tls.crt")  # fmt: skip
    address = f"127.0.0.1:{free_port()}"
    settings = {
        "version": 0.1,
        "log": {"level": "error"},
        "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
        "http": {"addr": address, "tls": {"certificate": str(work / "tls.crt"), "key": str(work / "tls.key")}},
    }
    (work / "config.yml").write_text(json.dumps(settings))  # YAML is a superset of JSON
    proc = subprocess.Popen([binary, "serve", str(work / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        context = ssl.create_default_context(cafile=str(work / "ca.crt"))

        def answers() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                with urllib.request.urlopen(f"https://{address}/v2/", context=context, timeout=2):
                    return True
            except OSError:
                return False

        wait_until(answers, 60, "the registry", interval=0.2)
        yield address, work / "ca.crt"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(address: str, ca: Path, path: str, accept: str = "application/json") -> Any:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://{address}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return json.loads(response.read())


def _release(address: str, ca: Path, path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``REGISTRY=<address>/<path> tools/release.sh --push-only VERSION``, trusting the CA."""
    helm = helm_path("v3")
    if helm is None:
        missing_tool("helm v3", "tools/install-test-tools.sh")
    home = tmp_path / f"helm-{path}"
    return subprocess.run(
        [str(REPO / "tools" / "release.sh"), "--push-only", _project_version()],
        capture_output=True, text=True, timeout=1800, check=False,
        env={**os.environ, "REGISTRY": f"{address}/{path}", "HELM": str(helm), "SSL_CERT_FILE": str(ca),
             "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
             "HELM_DATA_HOME": f"{home}/data"},
    )  # fmt: skip


def _config_of(address: str, ca: Path, repository: str, manifest: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = _get(address, ca, f"/v2/{repository}/blobs/{manifest['config']['digest']}")
    return config


def test_release_pushes_one_manifest_list_of_both_architectures(
    image: BuiltImage, arm64_image: BuiltImage, registry: tuple[str, Path], tmp_path: Path
) -> None:
    """``tools/release.sh --push-only VERSION`` with the release's images of both
    architectures built: one OCI image index under the version's tag, an entry per platform
    whose image is that architecture's, and the chart beside it."""
    address, ca = registry
    version = _project_version()
    name = f"{address}/ate-dev/ate-devplugin:{version}"
    for arch, built in (("amd64", image), ("arm64", arm64_image)):
        buildah("tag", built.name, f"{name}-{arch}")
    try:
        out = _release(address, ca, "ate-dev", tmp_path)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    finally:
        for arch in ("amd64", "arm64"):
            buildah("rmi", f"{name}-{arch}", check=False)
        buildah("manifest", "rm", name, check=False)
    assert f"pushing {name} (amd64 arm64)" in out.stdout
    print(f"\n{out.stdout}")

    repository = "ate-dev/ate-devplugin"
    index = _get(address, ca, f"/v2/{repository}/manifests/{version}", "application/vnd.oci.image.index.v1+json")
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]): m for m in index["manifests"]}
    assert set(platforms) == {("linux", "amd64"), ("linux", "arm64")}
    for (_, arch), entry in platforms.items():
        config = _config_of(address, ca, repository, _get(address, ca, f"/v2/{repository}/manifests/{entry['digest']}",
                                                          entry["mediaType"]))  # fmt: skip
        assert config["architecture"] == arch
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == version
    assert _get(address, ca, f"/v2/{repository}/tags/list")["tags"] == [version]
    assert _get(address, ca, "/v2/ate-dev/charts/ate-devplugin/tags/list")["tags"] == [version]


def test_release_of_one_image_pushes_it_alone(image: BuiltImage, registry: tuple[str, Path], tmp_path: Path) -> None:
    """Without the release's per-architecture images, ``--push-only`` pushes the one image
    under the release name as it is (tests/e2e publishes so); with only some of them it
    refuses, naming what is there."""
    address, ca = registry
    version = _project_version()
    name = f"{address}/single/ate-devplugin:{version}"
    buildah("tag", image.name, name)
    try:
        out = _release(address, ca, "single", tmp_path)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        buildah("tag", image.name, f"{name}-amd64")
        partial = _release(address, ca, "single", tmp_path)
    finally:
        buildah("rmi", name, f"{name}-amd64", check=False)
    assert f"pushing {name} (one architecture)" in out.stdout
    accept = "application/vnd.oci.image.manifest.v1+json"
    manifest = _get(address, ca, f"/v2/single/ate-devplugin/manifests/{version}", accept)
    assert manifest["mediaType"] == accept
    assert _config_of(address, ca, "single/ate-devplugin", manifest)["architecture"] == "amd64"
    assert partial.returncode == 2
    assert f"ARCHS is 'amd64 arm64' but only amd64 of {name}-<arch> are built" in partial.stderr
