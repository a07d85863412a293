"""Bad input: malformed config files through the CLI, a fuzzed sample of the same,
configs that can never work, unbounded inputs (an alias bomb, a FIFO, a device, a huge
file) at start and on a live reload, the chart refusing what the daemon refuses, device
paths that try to leave the device root, and `m` (mknod) as the kubelet sees it.

The corpus runs in-process (``cli.main``: the same code path, no interpreter start per
file); a few subprocess runs check what only a real process shows: the exit code, one
line on stderr, the peak memory. A file with several problems gets a line for each, the
first naming the field the file is about.

Each file in ``bad_configs/`` starts with ``# field: <the field the error must name>``
(``{path}`` for the file's own path) and ``# why: <what is wrong>``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from resource import RLIMIT_AS, prlimit
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ate_devplugin import cli
from ate_devplugin.config import MAX_PROBLEMS, ConfigError, check_across, resources_from_document
from tests.harness.chart import CHART, Helm, helm_path
from tests.harness.daemon import MakeDaemon
from tests.harness.devices import add_device_node, device_number, make_device_root, mknod_char
from tests.harness.faults import SpawnDaemon, log_matches
from tests.harness.kubelet import DeviceSpec, KubeletBench
from tests.harness.net import free_port
from tests.harness.require import missing_tool
from tests.harness.wait import wait_until

BAD_CONFIGS = Path(__file__).parent / "bad_configs"
CORPUS = sorted(BAD_CONFIGS.glob("*.yaml"))
KVM = "ate.dev/kvm"
GOOD = "resources:\n  - {name: ate.dev/kvm, devices: [/dev/kvm], units: 8}\n"
MEMORY_BOUND_MIB = 100


def expected_field(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# field: "), f"{path.name}: first line must name the field"
    field = first.removeprefix("# field: ").strip()
    return str(path) if field == "{path}" else field


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A plugin dir with a short path: a socket path must fit 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="ate-", dir="/tmp") as d:
        yield Path(d)


def run_in_process(args: list[str], plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    if args[0] == "run":
        args = [*args, "--plugin-dir", str(plugin_dir), "--device-root", "/dev", "--metrics-address", "127.0.0.1:0"]
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def check_rejected(code: int, out: str, err: str, field: str, what: str) -> None:
    assert code == 2, f"{what}: exit {code}: {err}"
    lines = err.splitlines()
    # A line per problem (at most MAX_PROBLEMS, then one with the count of the rest).
    assert 1 <= len(lines) <= MAX_PROBLEMS + 1, f"{what}: {len(lines)} lines on stderr:\n{err[-2000:]}"
    assert all(line.startswith("ate-devplugin: config error: ") for line in lines), f"{what}:\n{err[-2000:]}"
    assert lines[0].startswith(f"ate-devplugin: config error: {field}: "), f"{what}: {lines[0]}"
    assert out == ""


def test_the_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 30
    for path in CORPUS:
        expected_field(path)
        assert b"\n# why: " in path.read_bytes(), path.name


def test_every_malformed_config_exits_2_with_a_line_per_problem_and_starts_nothing(
    tmp_path: Path, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [(path.name, path, expected_field(path)) for path in CORPUS]
    cases += [
        ("missing-file", tmp_path / "absent.yaml", str(tmp_path / "absent.yaml")),
        ("a-directory", tmp_path, str(tmp_path)),
    ]
    failures = []
    for name, path, field in cases:
        for args in (["check-config", str(path)], ["run", "--config", str(path)]):
            try:
                check_rejected(*run_in_process(args, short_dir, capsys), field, f"{name} {args[0]}")
            except AssertionError as exc:
                failures.append(str(exc))
    assert not failures, "\n".join(failures)
    assert list(short_dir.iterdir()) == []  # nothing started: no socket, nor anything else


# --- inputs that can never work, or that must not be read unbounded --------------------


def never_working(directory: Path) -> list[tuple[str, Path, str, str]]:
    """(id, config path, field, words): made here, as they are too big to keep as files."""
    env = directory / "env-several-mb.yaml"
    env.write_text(f"resources: [{{name: a.b/c, devices: [/dev/kvm], env: {{BIG: {'x' * 3_000_000}}}}}]\n")
    env_under_cap = directory / "env-900kb.yaml"  # a file under the size cap
    env_under_cap.write_text(f"resources: [{{name: a.b/c, devices: [/dev/kvm], env: {{BIG: {'x' * 900_000}}}}}]\n")
    many = directory / "thousands-of-resources.yaml"
    many.write_text("resources:\n" + "".join(f"  - {{name: a.b/r{i}, devices: [/dev/kvm]}}\n" for i in range(5000)))
    huge = directory / "huge.yaml"
    with huge.open("w") as f:  # a valid config padded to 50 MB with comments
        f.write(GOOD)
        for _ in range(50):
            f.write(("#" * 1023 + "\n") * 1024)
    fifo = directory / "fifo.yaml"
    os.mkfifo(fifo)
    return [
        ("env-several-mb", env, str(env), "is larger than 1048576 bytes"),
        ("env-900kb", env_under_cap, "resources[0].env.BIG", "at most 4096 characters"),
        ("thousands-of-resources", many, "resources", "at most 64 entries"),
        ("huge-file", huge, str(huge), "is larger than 1048576 bytes"),
        ("fifo", fifo, str(fifo), "is not a regular file (a FIFO)"),
        ("device-file", Path("/dev/null"), "/dev/null", "is not a regular file (a character device)"),
    ]


def test_configs_that_can_never_work_or_must_not_be_read_exit_2(
    tmp_path: Path, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, path, field, words in never_working(tmp_path):
        for args in (["check-config", str(path)], ["run", "--config", str(path)]):
            code, out, err = run_in_process(args, short_dir, capsys)
            check_rejected(code, out, err, field, f"{name} {args[0]}")
            assert words in err, f"{name}: {err}"
            assert len(err) < 400, f"{name}: the value is echoed: {len(err)} characters"


# Runs the command in a fork of a small interpreter and reports its peak memory: measured
# from pytest itself, a child's ru_maxrss would count the pytest process it forked from.
_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"@peak-kib {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(args: list[str], timeout: float = 60) -> tuple[int, str, float]:
    """Exit code, stderr and peak resident memory (MiB) of ``python -m ate_devplugin ARGS``,
    killed after ``timeout`` (a process blocked on its input)."""
    argv = [sys.executable, "-c", _MEASURE, "-m", "ate_devplugin", *args]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{args[:2]} still running after {timeout}s (blocked on its input?)")
    text, _, peak = err.decode(errors="replace").rpartition("@peak-kib ")
    return proc.returncode, text, int(peak) / 1024


@pytest.mark.parametrize("case", ["yaml-alias-bomb", "fifo", "not-utf8", "missing"])
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_real_process_exits_2_with_one_line_in_bounded_memory(
    case: str, command: str, tmp_path: Path, short_dir: Path
) -> None:
    path = {"yaml-alias-bomb": BAD_CONFIGS / "yaml-alias-bomb.yaml", "not-utf8": BAD_CONFIGS / "not-utf8.yaml"}.get(
        case, tmp_path / "config.yaml"
    )
    if case == "fifo":
        os.mkfifo(path)
    args = ["check-config", str(path)] if command == "check-config" else ["run", "--config", str(path)]
    if command == "run":
        args += ["--plugin-dir", str(short_dir), "--metrics-address", f"127.0.0.1:{free_port()}"]
    code, err, peak_mib = run_measured(args)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("ate-devplugin: config error: "), err
    assert "Traceback" not in err
    assert peak_mib < MEMORY_BOUND_MIB, f"peak {peak_mib:.0f} MiB"
    assert list(short_dir.iterdir()) == []


def test_a_metrics_port_is_never_opened_for_a_bad_config(short_dir: Path) -> None:
    """The port a bad config names stays free while the daemon runs and after it exits."""
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "ate_devplugin", "run", "--config", str(BAD_CONFIGS / "units-zero.yaml"),
         "--plugin-dir", str(short_dir), "--metrics-address", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: nobody ever listened there for long
    assert list(short_dir.iterdir()) == []


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def peak_rss_mib(pid: int) -> float:
    return _status_kib(pid, "VmHWM") / 1024


def virtual_size(pid: int) -> int:
    return _status_kib(pid, "VmSize") * 1024


@pytest.mark.parametrize("bad", ["yaml-alias-bomb", "fifo", "device-file", "huge-file"])
def test_a_bad_live_reload_is_rejected_in_bounded_memory_and_the_loop_answers(
    bad: str, spawn_daemon: SpawnDaemon, tmp_path: Path, short_dir: Path
) -> None:
    """The running daemon refuses the new file (counted), keeps its config, stays under
    the memory bound and keeps answering /healthz."""
    root = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    d = spawn_daemon(root, config=GOOD, plugin_dir=str(short_dir))
    assert d.config_path is not None
    wait_until(lambda: (short_dir / "ate-ate-dev-kvm.sock").exists(), 30, "the plugin socket")
    assert d.proc is not None
    # A ceiling far above the bound, so that a daemon reading without limit fails fast
    # instead of taking the machine's memory.
    ceiling = virtual_size(d.proc.pid) + 1024 * 1024 * 1024
    prlimit(d.proc.pid, RLIMIT_AS, (ceiling, ceiling))
    staged = tmp_path / "staged"
    if bad == "fifo":
        os.mkfifo(staged)
    elif bad == "device-file":
        os.mknod(staged, 0o600 | 0o020000, os.makedev(1, 5))  # a /dev/zero: endless bytes
    elif bad == "huge-file":
        with staged.open("w") as f:
            f.write(GOOD + ("#" * 1023 + "\n") * 1024 * 50)
    else:
        staged.write_bytes((BAD_CONFIGS / "yaml-alias-bomb.yaml").read_bytes())
    os.replace(staged, d.config_path)  # a rename, as a config tool or the ConfigMap swap does
    wait_until(
        lambda: d.metric("ate_devplugin_config_reloads_total", result="failure") >= 1, 30, "the reload to be rejected"
    )
    assert d.get("/healthz")[0] == 200
    assert d.metric("ate_devplugin_config_reloads_total", result="success") == 0
    assert d.metric("ate_devplugin_config_rejected") == 1
    assert (short_dir / "ate-ate-dev-kvm.sock").exists()  # still serving the last good config
    assert log_matches(d.log_lines(), "config reload rejected")
    assert peak_rss_mib(d.proc.pid) < MEMORY_BOUND_MIB


# --- the chart refuses what the daemon refuses ------------------------------------------

CHART_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "units-over-the-message-limit": ({"units": 1_000_000}, "units exceed the kubelet's 4 MiB message limit"),
    "name-starting-requests": ({"name": "requests.ate.dev/kvm"}, "/deviceConfig/resources/0/name"),
    "name-part-of-64": ({"name": "ate.dev/" + "k" * 64}, "/deviceConfig/resources/0/name"),
    "domain-over-253": ({"name": ".".join(["d" * 63] * 4) + ".dd/x"}, "/deviceConfig/resources/0/name"),
    "repeated-permission-letters": ({"permissions": "rwr"}, "/deviceConfig/resources/0/permissions"),
    "device-path-ending-in-newline": ({"devices": ["/dev/kvm\n"]}, "/deviceConfig/resources/0/devices"),
    "env-value-of-several-mb": ({"env": {"BIG": "x" * 3_000_000}}, "/deviceConfig/resources/0/env/BIG"),
}


@pytest.mark.parametrize("major", ["v3", "v4"])
def test_helm_refuses_what_the_daemon_refuses(major: str, tmp_path: Path) -> None:
    path = helm_path(major)
    if path is None:
        missing_tool(f"helm {major} (build/bin/helm-{major} or $HELM_{major.upper()})", "tools/build-helm.sh")
    helm = Helm(major, path)
    cases = {
        k: ([{"name": KVM, "devices": ["/dev/kvm"], **change}], words) for k, (change, words) in CHART_CASES.items()
    }
    cases["two-names-one-socket"] = (
        [{"name": "a.b/c", "devices": ["/dev/kvm"]}, {"name": "a-b/c", "devices": ["/dev/kvm"]}],
        "deviceConfig.resources[1].name: 'a-b/c' collides with resources[0]",
    )
    cases["thousands-of-resources"] = (
        [{"name": f"a.b/r{i}", "devices": ["/dev/kvm"]} for i in range(5000)],
        "/deviceConfig/resources",
    )
    for case, (resources, words) in cases.items():
        values = tmp_path / f"{case}.yaml"
        values.write_text(yaml.safe_dump({"deviceConfig": {"resources": resources}}))
        result = helm.run("template", "ate", str(CHART), "--values", str(values))
        assert result.returncode != 0, f"{case}: helm {major} renders it"
        assert words in result.stderr, f"{case}: {result.stderr[-1000:]}"
        with pytest.raises(ConfigError):  # and the daemon refuses it too
            check_across(resources_from_document({"resources": resources}), "/var/lib/kubelet/device-plugins")


# --- fuzzed documents through the CLI (in-process) ---------------------------------------

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
    max_examples=int(os.environ.get("ATE_FUZZ_CLI_EXAMPLES", "200")),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=st.one_of(_fragments, st.fixed_dictionaries({"resources": st.lists(_fragments, max_size=2)})))
def test_fuzzed_documents_through_the_cli(
    doc: object, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    code = cli.main(["check-config", str(config)])
    _, err = capsys.readouterr()
    assert code in (0, 2), err
    if code == 2:
        lines = err.splitlines()
        assert 1 <= len(lines) <= MAX_PROBLEMS + 1, err
        assert all(re.match(r"ate-devplugin: config error: \S.*?: ", line) for line in lines), err


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
