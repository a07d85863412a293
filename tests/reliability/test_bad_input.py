"""Bad input: malformed config files through the real CLI, a fuzzed sample of the same,
device paths that try to leave the device root, and `m` (mknod) as the kubelet sees it.

Each file in ``bad_configs/`` starts with ``# field: <the field the error must name>``
(``{path}`` for the file's own path) and ``# why: <what is wrong>``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.daemon import MakeDaemon
from tests.harness.devices import add_device_node, device_number, make_device_root, mknod_char
from tests.harness.faults import log_matches
from tests.harness.kubelet import DeviceSpec, KubeletBench
from tests.harness.net import free_port
from tests.harness.wait import wait_until

BAD_CONFIGS = Path(__file__).parent / "bad_configs"
CORPUS = sorted(BAD_CONFIGS.glob("*.yaml"))
KVM = "ate.dev/kvm"


@dataclass(frozen=True)
class Outcome:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    plugin_dir: Path


def cli(args: list[str], workdir: Path) -> Outcome:
    """One CLI run with a plugin dir and a metrics port of its own (for `run`)."""
    plugin_dir = workdir / "plugins"
    plugin_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ate_devplugin", *args]
    if args[0] == "run":
        argv += [
            "--plugin-dir",
            str(plugin_dir),
            "--device-root",
            str(workdir),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
        ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return Outcome(argv, result.returncode, result.stdout, result.stderr, plugin_dir)


def expected_field(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# field: "), f"{path.name}: first line must name the field"
    field = first.removeprefix("# field: ").strip()
    return str(path) if field == "{path}" else field


def check_rejected(outcome: Outcome, field: str) -> None:
    what = f"{' '.join(outcome.argv[3:5])}"
    assert outcome.returncode == 2, f"{what}: exit {outcome.returncode}: {outcome.stderr.strip().splitlines()[-1:]}"
    assert "Traceback" not in outcome.stderr, f"{what}:\n{outcome.stderr[-2000:]}"
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, f"{what}: {len(lines)} lines on stderr:\n{outcome.stderr[-2000:]}"
    assert lines[0].startswith(f"ate-devplugin: config error: {field}: "), f"{what}: {lines[0]}"
    assert outcome.stdout == ""
    # Nothing started: no socket (nor anything else) in the plugin dir.
    assert list(outcome.plugin_dir.iterdir()) == [], what


def test_the_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 30
    for path in CORPUS:
        expected_field(path)
        assert b"\n# why: " in path.read_bytes(), path.name


def test_every_malformed_config_exits_2_with_one_line_and_starts_nothing(tmp_path: Path) -> None:
    extra = {
        "missing-file": (tmp_path / "absent.yaml", str(tmp_path / "absent.yaml")),
        "a-directory": (tmp_path, str(tmp_path)),
    }
    jobs: list[tuple[str, list[str], str, Path]] = []
    for path in CORPUS:
        field = expected_field(path)
        jobs.append((path.name, ["check-config", str(path)], field, tmp_path / "w" / f"{path.stem}-check"))
        jobs.append((path.name, ["run", "--config", str(path)], field, tmp_path / "w" / f"{path.stem}-run"))
    for name, (path, field) in extra.items():
        jobs.append((name, ["check-config", str(path)], field, tmp_path / "w" / f"{name}-check"))
        jobs.append((name, ["run", "--config", str(path)], field, tmp_path / "w" / f"{name}-run"))
    with ThreadPoolExecutor(max_workers=(os.cpu_count() or 2) + 1) as pool:
        outcomes = list(pool.map(lambda job: cli(job[1], job[3]), jobs))
    failures = []
    for (name, _, field, _), outcome in zip(jobs, outcomes, strict=True):
        try:
            check_rejected(outcome, field)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


def test_a_metrics_port_is_never_opened_for_a_bad_config(tmp_path: Path) -> None:
    """The port a bad config names stays free while the daemon runs and after it exits."""
    port = free_port()
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ate_devplugin",
            "run",
            "--config",
            str(BAD_CONFIGS / "units-zero.yaml"),
            "--plugin-dir",
            str(plugin_dir),
            "--metrics-address",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: nobody ever listened there for long
    assert list(plugin_dir.iterdir()) == []


# --- fuzzed documents through the real CLI (a sample) ---------------------------------

_fragments = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(max_size=12),
        st.sampled_from(["ate.dev/kvm", "/dev/kvm", "/dev/../etc", "rwm", "rwx", "kubernetes.io/x"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["resources", "name", "devices", "units", "permissions", "mounts", "env", "x"]),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=10,
)


@settings(
    max_examples=int(os.environ.get("ATE_FUZZ_CLI_EXAMPLES", "12")),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=st.one_of(_fragments, st.fixed_dictionaries({"resources": st.lists(_fragments, max_size=2)})))
def test_fuzzed_documents_through_the_cli(doc: object, tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    outcome = cli(["check-config", str(config)], work)
    assert outcome.returncode in (0, 2), outcome.stderr
    assert "Traceback" not in outcome.stderr
    if outcome.returncode == 2:
        assert len(outcome.stderr.splitlines()) == 1
        assert outcome.stderr.startswith("ate-devplugin: config error: ")


# --- device paths that leave the device root, against the running daemon ----------------


def test_device_nodes_resolving_outside_the_root_are_ignored(
    kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path, tmp_path: Path
) -> None:
    outside = make_device_root(tmp_path / "outside", {"kvm": "/dev/kvm", "net/tun": "/dev/net/tun"})
    (device_root / "kvm").unlink()
    (device_root / "kvm").symlink_to(outside / "kvm")  # absolute, to a real node outside
    (device_root / "net").symlink_to(outside / "net")  # a directory outside
    (device_root / "vhost-net").symlink_to("../outside/kvm")  # relative, climbing out
    add_device_node(device_root, "real-kvm", "/dev/kvm")
    (device_root / "alias").symlink_to("/dev/real-kvm")  # a host path inside: fine
    d = daemon(
        "resources:\n"
        "  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 8}\n"
        "  - {name: ate.dev/tun, devices: [/dev/net/tun], units: 8}\n"
        "  - {name: ate.dev/vhost, devices: [/dev/vhost-net], units: 8}\n"
        "  - {name: ate.dev/alias, devices: [/dev/alias], units: 8}\n"
    )
    kubelet.wait("ate.dev/alias", capacity=8, allocatable=8, timeout=30)
    capacity = kubelet.capacity()
    for resource in ("ate.dev/kvm", "ate.dev/tun", "ate.dev/vhost"):
        assert capacity.of(resource) == (0, 0), resource  # never advertised
        assert d.metric("ate_devplugin_device_nodes_present", resource_name=resource) == 0
    lines = d.log_lines()
    for host_path in ("/dev/kvm", "/dev/net/tun", "/dev/vhost-net"):
        assert log_matches(lines, f"ignoring {host_path}: it resolves outside the device root"), host_path
    # The runtime is told the configured path, never the outside one.
    assert kubelet.allocate("pod-a", "vm", {"ate.dev/alias": 1}).devices == [
        DeviceSpec("/dev/alias", "/dev/alias", "rw")
    ]

    # A node advertised while inside, then swapped for an escaping link: unhealthy.
    (device_root / "kvm").unlink()
    add_device_node(device_root, "kvm", "/dev/kvm")
    kubelet.wait(KVM, capacity=8, allocatable=8, timeout=30)
    link = device_root / ".kvm-new"
    link.symlink_to(outside / "kvm")
    os.replace(link, device_root / "kvm")
    kubelet.wait(KVM, capacity=8, allocatable=0, timeout=30)
    assert d.metric("ate_devplugin_device_nodes_present", resource_name=KVM) == 0


def test_a_link_loop_and_a_non_device_are_ignored(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    (device_root / "loop-a").symlink_to("loop-b")
    (device_root / "loop-b").symlink_to("loop-a")
    (device_root / "plain").write_text("not a device\n")
    os.mkfifo(device_root / "fifo")
    d = daemon(
        "resources:\n"
        "  - {name: ate.dev/loop, devices: [/dev/loop-a], units: 2}\n"
        "  - {name: ate.dev/plain, devices: [/dev/plain], units: 2}\n"
        "  - {name: ate.dev/fifo, devices: [/dev/fifo], units: 2}\n"
        "  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 2}\n"
    )
    kubelet.wait(KVM, capacity=2, allocatable=2, timeout=30)
    for resource in ("ate.dev/loop", "ate.dev/plain", "ate.dev/fifo"):
        assert kubelet.capacity().of(resource) == (0, 0), resource
    assert d.running()


# --- m (mknod) only when configured, as the container runtime would be told ------------


def test_mknod_is_granted_only_where_configured(kubelet: KubeletBench, daemon: MakeDaemon, device_root: Path) -> None:
    for name in ("net/tun", "vhost-net", "dri/renderD128", "dri/renderD129"):
        number = device_number("/dev/kvm") if name.startswith("dri") else device_number(f"/dev/{name}")
        mknod_char(device_root / name, number)
    daemon(
        "resources:\n"
        "  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 4}\n"  # default: rw
        "  - {name: ate.dev/tun, devices: [/dev/net/tun], units: 4, permissions: r}\n"
        "  - {name: ate.dev/render, devices: ['/dev/dri/renderD*'], units: 4, permissions: wr}\n"
        "  - {name: ate.dev/vhost, devices: [/dev/vhost-net], units: 4, permissions: mrw}\n"
    )
    for resource in ("ate.dev/kvm", "ate.dev/tun", "ate.dev/render", "ate.dev/vhost"):
        kubelet.wait(resource, capacity=4, allocatable=4, timeout=30)
    plain = kubelet.allocate("pod-a", "vm", {"ate.dev/kvm": 1, "ate.dev/tun": 1, "ate.dev/render": 1})
    assert sorted((s.host_path, s.permissions) for s in plain.devices) == [
        ("/dev/dri/renderD128", "rw"),
        ("/dev/dri/renderD129", "rw"),
        ("/dev/kvm", "rw"),
        ("/dev/net/tun", "r"),
    ]
    assert all("m" not in s.permissions for s in plain.devices)
    asked = kubelet.allocate("pod-b", "vm", {"ate.dev/vhost": 1})
    assert [(s.host_path, s.permissions) for s in asked.devices] == [("/dev/vhost-net", "rwm")]


def test_default_config_never_grants_mknod(kubelet: KubeletBench, daemon: MakeDaemon) -> None:
    d = daemon()  # no config file: ate.dev/kvm -> /dev/kvm, rw
    kubelet.wait(KVM, capacity=4096, allocatable=4096, timeout=30)
    wait_until(d.ready, 10, "readyz")
    for n in range(3):
        alloc = kubelet.allocate(f"pod-{n}", "vm", {KVM: 1 + n})
        assert alloc.devices == [DeviceSpec("/dev/kvm", "/dev/kvm", "rw")]
