"""The container image: hadolint-clean Dockerfile; built with buildah; OCI labels, the revision
the built commit in its label and in ate_devplugin_build_info; entrypoint, no compilers or pip,
bytecode precompiled; the daemon inside starts and answers /metrics, both under `buildah run`
with every capability dropped and in a chroot whose root filesystem is read-only, as UID 0
without any capability and with no_new_privs, as the chart runs it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.devices import make_device_root
from tests.harness.image import REPO, BuiltImage, WorkingContainer, buildah
from tests.harness.net import free_port, http_get
from tests.harness.require import require, require_tool
from tests.harness.wait import wait_until

DOCKERFILE = REPO / "Dockerfile"
COMPILERS_AND_INSTALLERS = ("gcc", "cc", "c++", "g++", "clang", "ld", "as", "make", "pip", "pip3", "apt-get")


def _head_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.strip()


def _revision(image: BuiltImage) -> str:
    revision: str = image.config["config"]["Labels"]["org.opencontainers.image.revision"]
    return revision


def _project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


# --- Dockerfile -----------------------------------------------------------------------------


def test_hadolint_clean(hadolint: str) -> None:
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == ""


def test_every_hadolint_ignore_has_a_reason() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            assert i > 0, "an ignore needs a reason on the line above"
            assert lines[i - 1].startswith("#"), f"no reason above line {i + 1}: {line}"
            assert len(lines[i - 1]) > 30, f"no reason above line {i + 1}: {line}"


def test_dockerfile_is_multi_stage_from_the_local_base() -> None:
    text = DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim" in text
    assert len(re.findall(r"^FROM ", text, flags=re.MULTILINE)) >= 2
    assert 'ENTRYPOINT ["ate-devplugin"]' in text


# --- the built image ------------------------------------------------------------------------


def test_image_config(image: BuiltImage) -> None:
    config = image.config["config"]
    assert config["Entrypoint"] == ["ate-devplugin"]
    assert config["Cmd"] == ["run"]
    assert config.get("User", "") in {"", "0", "root"}, "the daemon needs UID 0 for the kubelet's socket directory"
    assert "9477/tcp" in config.get("ExposedPorts", {})
    assert config.get("StopSignal") == "SIGTERM"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].startswith("/opt/ate-devplugin/bin:")
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "ate-devplugin"
    assert labels["org.opencontainers.image.version"] == _project_version()
    assert labels["org.opencontainers.image.base.name"] == "docker.io/library/debian:bookworm-slim"
    license_ = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("license")
    if isinstance(license_, str):
        assert labels["org.opencontainers.image.licenses"] == license_
    for key in ("description", "created"):
        assert labels[f"org.opencontainers.image.{key}"], key
    # The commit built ("-dirty": with uncommitted changes), and the daemon is told it.
    head = _head_commit()
    assert labels["org.opencontainers.image.revision"] in (head, f"{head}-dirty")
    assert env["ATE_DEVPLUGIN_REVISION"] == labels["org.opencontainers.image.revision"]


def test_image_is_small_and_has_no_toolchain(image: BuiltImage, container: WorkingContainer) -> None:
    size = sum(
        (Path(d) / f).lstat().st_size for d, _, files in os.walk(container.root) for f in files
    )  # fmt: skip
    # Debian slim (~75 MB) + python3 (~30 MB) + the daemon's wheels (grpcio, protobuf, OTel).
    assert size < 300 * 1024 * 1024, f"image root filesystem is {size / 2**20:.0f} MiB"
    for bindir in ("usr/bin", "usr/local/bin", "usr/sbin", "opt/ate-devplugin/bin"):
        for name in COMPILERS_AND_INSTALLERS:
            if name == "apt-get" and bindir == "usr/bin":
                continue  # part of the Debian base itself
            assert not (container.root / bindir / name).exists(), f"/{bindir}/{name} in the final image"
    assert not list((container.root / "var/lib/apt/lists").glob("*_Packages")), "apt lists left in the image"
    assert not list((container.root / "var/cache/apt/archives").glob("*.deb"))


def test_bytecode_precompiled(container: WorkingContainer) -> None:
    """Every module of the venv has its .pyc next to it (the root filesystem is read-only at
    run time, nothing could be cached then), hash-based so that file times do not matter."""
    (site,) = (container.root / "opt/ate-devplugin/lib").glob("python3.*/site-packages")
    missing: list[str] = []
    checked = 0
    for py in site.rglob("*.py"):
        pyc = py.parent / "__pycache__" / f"{py.stem}.cpython-311.pyc"
        if not pyc.is_file():
            missing.append(str(py.relative_to(site)))
            continue
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags & 0b1, f"{pyc.relative_to(site)} is timestamp-based"
        checked += 1
    assert not missing, f"{len(missing)} modules without bytecode, e.g. {missing[:5]}"
    assert (site / "ate_devplugin" / "__pycache__").is_dir()
    assert checked > 100


def test_version_command(container: WorkingContainer) -> None:
    out = buildah("run", "--isolation", "chroot", container.name, "--", "ate-devplugin", "version", timeout=120)
    assert _project_version() in out.stdout


# --- the daemon running from the image -------------------------------------------------------


def _wait_for_metrics(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> str:
    def metrics() -> str:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"daemon exited with {proc.returncode}:\n{out}\n{err}")
        with contextlib.suppress(OSError):
            status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            if status == 200:
                return body.decode()
        return ""

    return wait_until(metrics, timeout, f"/metrics on 127.0.0.1:{port}", interval=0.2)


def _daemon_pid(port: int) -> int:
    """The daemon's host PID, found by its unique metrics address on the command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"python" in part for part in cmdline[:1]) and f"--metrics-address=127.0.0.1:{port}".encode() in cmdline:
            return int(entry.name)
    raise AssertionError("daemon process not found")


@pytest.fixture
def host_dirs(tmp_path: Path) -> dict[str, Path]:
    """What the chart mounts: the kubelet's socket directory, the host's /dev (here a device
    root with a real kvm character node) and the config directory."""
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(
        "resources:\n  - name: ate.dev/kvm\n    devices: [/dev/kvm]\n    units: 16\n    permissions: rw\n"
    )
    return {"plugins": plugins, "dev": make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"}), "config": config}


def _daemon_args(port: int) -> list[str]:
    # The same arguments the chart's DaemonSet passes.
    return [
        "ate-devplugin", "run",
        "--config=/etc/ate-devplugin/config.yaml",
        "--device-root=/host/dev",
        "--plugin-dir=/var/lib/kubelet/device-plugins",
        f"--metrics-address=127.0.0.1:{port}",
        "--log-format=json",
        "--log-level=info",
        "--kvm-probe=off",
    ]  # fmt: skip


def _check_running_daemon(port: int, proc: subprocess.Popen[str], revision: str) -> str:
    """Checks the daemon on ``port``, then SIGTERMs it, as the runtime does (to the daemon
    itself: ``buildah run`` would SIGKILL it); returns its /proc status from before."""
    body = _wait_for_metrics(port, proc)
    (build_info,) = re.findall(r"^ate_devplugin_build_info\{.*$", body, re.MULTILINE)
    assert f'version="{_project_version()}"' in build_info, build_info
    assert f'revision="{revision}"' in build_info, build_info
    assert 'ate_devplugin_device_nodes_present{resource_name="ate.dev/kvm"} 1.0' in body
    assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    pid = _daemon_pid(port)
    status = Path(f"/proc/{pid}/status").read_text()
    os.kill(pid, signal.SIGTERM)
    start = time.monotonic()
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, f"exit {proc.returncode} after SIGTERM:\n{out}\n{err}"
    assert time.monotonic() - start < 7, "did not stop within 5 s of SIGTERM"
    return status


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_daemon_in_buildah_run_without_capabilities(
    image: BuiltImage, container: WorkingContainer, host_dirs: dict[str, Path], reap: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        ["buildah", "--storage-driver", "vfs", "run", "--isolation", "chroot", "--network", "host",
         "--cap-drop", "ALL",
         "-v", f"{host_dirs['plugins']}:/var/lib/kubelet/device-plugins",
         "-v", f"{host_dirs['dev']}:/host/dev:ro",
         "-v", f"{host_dirs['config']}:/etc/ate-devplugin:ro",
         container.name, "--", *_daemon_args(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    reap.append(proc)

    status = _check_running_daemon(port, proc, _revision(image))
    assert re.search(r"^CapEff:\s+0+$", status, re.MULTILINE), status
    assert not list(host_dirs["plugins"].iterdir()), "sockets left behind after SIGTERM"


def test_daemon_with_read_only_root_as_the_chart_runs_it(
    image: BuiltImage, container: WorkingContainer, host_dirs: dict[str, Path], reap: list[subprocess.Popen[str]]
) -> None:
    """The chart's securityContext, reproduced without a container runtime: a private mount
    and PID namespace, the image's root filesystem bound read-only, a tmpfs /tmp, the host
    paths where the DaemonSet mounts them, then the daemon as PID 1 and UID 0 with an empty
    capability bounding set and no_new_privs (what allowPrivilegeEscalation=false sets)."""
    require_tool("unshare", "apt-get install -y util-linux")
    require((container.root / "usr/bin/setpriv").exists(), "needs setpriv (util-linux) in the image")
    root = container.root
    for mountpoint in ("var/lib/kubelet/device-plugins", "host/dev", "etc/ate-devplugin"):
        (root / mountpoint).mkdir(parents=True, exist_ok=True)
    env = ["env", "-i", *image.config["config"]["Env"]]
    port = free_port()
    script = f"""
        set -e
        mount --make-rprivate /
        mount --bind {root} {root}
        mount -o remount,bind,ro {root}
        mount -t tmpfs -o size=16m,mode=1777 tmpfs {root}/tmp
        mount --bind {host_dirs["plugins"]} {root}/var/lib/kubelet/device-plugins
        mount --bind {host_dirs["dev"]} {root}/host/dev
        mount -o remount,bind,ro {root}/host/dev
        mount --bind {host_dirs["config"]} {root}/etc/ate-devplugin
        mount -o remount,bind,ro {root}/etc/ate-devplugin
        mount -t proc proc {root}/proc
        exec chroot {root} /usr/bin/setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all \\
            --bounding-set=-all -- {" ".join(env)} {" ".join(_daemon_args(port))}
    """
    proc = subprocess.Popen(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    reap.append(proc)

    status = _check_running_daemon(port, proc, _revision(image))
    assert re.search(r"^CapEff:\s+0+$", status, re.MULTILINE), status
    assert re.search(r"^CapBnd:\s+0+$", status, re.MULTILINE), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.MULTILINE), status
    assert re.search(r"^Uid:\s+0\s", status, re.MULTILINE), status
    assert not list(host_dirs["plugins"].iterdir()), "sockets left behind after SIGTERM"
