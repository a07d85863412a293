"""The probe, verify and the facts against the real peer: this machine's kernel KVM.

Needs root (a 0600 /dev/kvm, mknod, a switch to nobody) and /dev/kvm: skipped elsewhere,
a failure under CI (tests/harness/require.py). On these machines KVM is PVM, a software
virtualisation: the facts must say so.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import ate_devplugin
from ate_devplugin.kvm import guest
from ate_devplugin.kvm.facts import read_node_facts
from ate_devplugin.kvm.probe import check
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.runner import ProbeRunner
from ate_devplugin.kvm.verify import verify
from tests.harness.devices import DeviceNumber, mknod_char
from tests.harness.require import require

KVM = "/dev/kvm"
SPIN = bytes.fromhex("ebfe")  # jmp . : a guest that never exits
APP = str(Path(ate_devplugin.__file__).parents[1])
NOBODY = 65534


@pytest.fixture(autouse=True)
def _real_kvm() -> None:
    require(os.path.exists(KVM), "no /dev/kvm on this machine")
    require(os.geteuid() == 0, "the real-device tests need root")


def test_the_probe_passes_on_this_machines_kvm_and_learns_its_facts() -> None:
    result = check(KVM, 5)
    assert (result.reason, result.passed, result.api_version, result.ran_guest) == (Reason.PASSED, True, 12, True)
    assert result.exits == tuple(e.describe() for e in guest.EXPECTED)
    assert result.rdev == "10:232"
    facts = result.device_facts
    assert facts is not None
    assert facts.api_version == 12
    assert facts.capabilities["max_vcpus"] >= 1
    assert facts.capabilities["user_memory"] == 1
    assert len(facts.cpuid_digest) == 32
    assert check(KVM, 5).device_facts == facts  # the same device says the same of itself
    print(json.dumps(result.to_json(), indent=1))


def test_the_real_guest_reports_a_wrong_exit_and_an_mmio_exit() -> None:
    other_port = check(KVM, 5, code=bytes.fromhex("ba8000b041eef4"))  # out 0x80, 'A'; hlt
    assert other_port.reason is Reason.WRONG_EXIT
    assert other_port.exits == ("out 0x80 'A'", "hlt")
    unmapped = check(KVM, 5, code=bytes.fromhex("a10000f4"))  # a read of guest address 0: no memory there
    assert unmapped.reason is Reason.WRONG_EXIT
    assert "KVM_EXIT_MMIO" in unmapped.message


def test_a_char_device_1_3_named_kvm_is_not_a_kvm_device(tmp_path: Path) -> None:
    node = mknod_char(tmp_path / "kvm", DeviceNumber(1, 3))
    result = check(str(node), 5)
    assert (result.reason, result.rdev) == (Reason.NOT_KVM, "1:3")
    assert "does not answer KVM_GET_API_VERSION: ENOTTY" in result.message


async def test_a_0600_kvm_node_probed_as_nobody_is_no_permission() -> None:
    """The real worker, as an unprivileged process, on a real KVM node it may not open
    (what a container without the device gets is EPERM from the device filter: the same code)."""
    setpriv = shutil.which("setpriv")
    require(setpriv, "setpriv not found; install with: apt-get install -y util-linux")
    assert setpriv is not None
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # /root is closed to nobody
    command = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
               "env", f"PYTHONPATH={APP}", python, "-m", "ate_devplugin.kvm.worker"]  # fmt: skip
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # pytest's tmp_path is closed to nobody
        os.chmod(tmp, 0o755)
        node = mknod_char(Path(tmp) / "kvm", DeviceNumber(10, 232), mode=0o600)
        prober = ProbeRunner(command)
        try:
            result = await prober.probe(str(node), 10)
        finally:
            await prober.close()
    assert result.reason is Reason.NO_PERMISSION
    assert result.message == f"{node}: opening character device 10:232: EACCES (Permission denied)"


def test_a_guest_that_never_exits_is_interrupted_by_the_probes_own_deadline() -> None:
    start = time.monotonic()
    result = check(KVM, 0.3, code=SPIN)
    assert result.reason is Reason.TIMED_OUT
    assert result.message == f"{KVM}: no answer within 0.3s (the guest's exits so far: none)"
    assert 0.3 <= time.monotonic() - start < 60  # a hang bound (the guest spins for ever), not a speed one
    assert check(KVM, 5).passed  # this process's KVM is none the worse


async def test_a_child_hung_in_kvm_run_is_killed_at_the_parents_deadline() -> None:
    """A worker without the child's own alarm, in KVM_RUN on a guest that never exits: only
    the parent's deadline ends it."""
    hang = (
        "import os, sys; from ate_devplugin.kvm import guest; sys.stdin.readline(); "
        f"guest.run(os.open({KVM!r}, os.O_RDWR), {SPIN!r})"
    )
    prober = ProbeRunner([sys.executable, "-c", hang])
    try:
        start = time.monotonic()
        result = await prober.probe(KVM, 0.5)
        took = time.monotonic() - start
    finally:
        await prober.close()
    assert result.reason is Reason.TIMED_OUT
    assert result.message == f"{KVM}: no answer within 0.5s: the probe process was killed"
    assert took < 60  # a hang bound: the child spins for ever unless killed
    assert prober.abandoned == []  # KVM_RUN ends on SIGKILL: nothing left behind


async def test_verify_passes_here_and_fails_on_a_1_3_node(tmp_path: Path) -> None:
    node = read_node_facts()
    out = io.StringIO()
    assert await verify(node, out, KVM) == 0
    report = out.getvalue().splitlines()
    print("\n".join(report))
    assert report[0] == f"ate-devplugin verify {KVM}"
    assert "  KVM API version: 12" in report
    assert report[-1].startswith(f"PASS: a VM ran guest code on {KVM} in ")
    fake = mknod_char(tmp_path / "kvm", DeviceNumber(1, 3))
    out = io.StringIO()
    assert await verify(node, out, str(fake)) == 1
    assert out.getvalue().splitlines()[-1].startswith(f"FAIL not-a-kvm-device: {fake}: character device 1:3 ")


def test_the_verify_command_passes_on_a_kvm_node_and_exits_1_on_another(tmp_path: Path) -> None:
    """`ate-devplugin verify` as a command, on nodes of its own (the helm test pod runs it,
    non-root, on the node its pod was granted: tests/e2e)."""
    command = [sys.executable, "-m", "ate_devplugin", "verify", "--timeout", "10", "--device"]
    granted = mknod_char(tmp_path / "kvm", DeviceNumber(10, 232), mode=0o666)
    wrong = mknod_char(tmp_path / "not-kvm", DeviceNumber(1, 3), mode=0o666)
    ok = subprocess.run([*command, str(granted)], capture_output=True, text=True, timeout=60, check=False)
    bad = subprocess.run([*command, str(wrong)], capture_output=True, text=True, timeout=60, check=False)
    print(ok.stdout + bad.stdout)
    assert (ok.returncode, ok.stderr) == (0, ""), ok
    assert "  KVM API version: 12" in ok.stdout.splitlines()
    assert ok.stdout.splitlines()[-1].startswith(f"PASS: a VM ran guest code on {granted} in ")
    assert bad.returncode == 1, bad
    assert bad.stdout.splitlines()[-1].startswith(f"FAIL not-a-kvm-device: {wrong}: character device 1:3 ")


# setpriv's options for a user: root with every capability gone (an empty bounding set and
# inheritable set leave none after exec), and a non-root user; no privilege escalation for both.
ROOT_NO_CAPS = ["--reuid=0", "--regid=0", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
NON_ROOT = ["--reuid=10001", "--regid=10001", "--clear-groups"]


@pytest.mark.parametrize(
    ("mode", "gid", "non_root_opens"), [(0o666, 0, True), (0o660, 36, False), (0o600, 0, False)]
)  # fmt: skip
def test_root_without_capabilities_opens_a_root_owned_node_of_every_common_mode(
    mode: int, gid: int, non_root_opens: bool
) -> None:
    """What the helm test pod relies on (chart/README.md, "helm test"), on the real device: uid 0
    with no capability and no_new_privs gets the owner's bits of a root-owned node, so `verify`
    passes on 0666, 0660 root:kvm and 0600 root:root; uid 10001 only on 0666, and its FAIL names
    the node's mode and owner and what would let it open it."""
    setpriv = shutil.which("setpriv")
    require(setpriv, "setpriv not found; install with: apt-get install -y util-linux")
    assert setpriv is not None
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # /root is closed to others
    script = (
        "import asyncio, sys; from ate_devplugin.kvm import verify, facts; "
        "sys.exit(asyncio.run(verify.verify(facts.read_node_facts(), sys.stdout, sys.argv[1], 10)))"
    )
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # pytest's tmp_path is closed to others
        os.chmod(tmp, 0o755)
        node = mknod_char(Path(tmp) / "kvm", DeviceNumber(10, 232), mode=mode)
        os.chown(node, 0, gid)
        command = ["--no-new-privs", "env", f"PYTHONPATH={APP}", python, "-c", script, str(node)]
        root, other = (
            subprocess.run([setpriv, *who, *command], capture_output=True, text=True, timeout=60, check=False)
            for who in (ROOT_NO_CAPS, NON_ROOT)
        )
    print(root.stdout + other.stdout)
    shown = f"character device 10:232, {stat.filemode(0o20000 | mode)} ({mode:04o}) owner 0:{gid} here"
    assert f"  device:          {shown}" in root.stdout.splitlines()
    assert "  process:         uid 0, gid 0, groups 0; no capabilities" in root.stdout.splitlines()
    assert (root.returncode, root.stdout.splitlines()[-1].split(":")[0]) == (0, "PASS"), root.stderr
    if non_root_opens:
        assert other.returncode == 0, other.stdout + other.stderr
        return
    report = other.stdout.splitlines()
    assert other.returncode == 1, other.stderr
    assert report[-1] == f"FAIL no-permission: {node}: opening character device 10:232: EACCES (Permission denied)"
    assert "  refused:         its mode gives uid 10001 (groups 10001) no read-write access (" in "\n".join(report)
    assert any(line.endswith("run as uid 0 with every capability dropped (root without CAP_DAC_OVERRIDE has "
                             "the owner's bits only)") for line in report)  # fmt: skip
    assert any(f"add gid {gid}, the node's group" in line for line in report) == (gid != 0)


def test_the_node_facts_agree_with_lscpu_and_uname_and_name_pvm_here() -> None:
    lscpu = shutil.which("lscpu")
    require(lscpu, "lscpu not found; install with: apt-get install -y util-linux")
    assert lscpu is not None
    fields = {f["field"].rstrip(":"): f["data"] for f in json.loads(subprocess.check_output([lscpu, "-J"]))["lscpu"]}
    facts = read_node_facts()
    print(json.dumps(facts.to_json(), indent=1))
    assert facts.kernel_release == os.uname().release
    assert {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine) == facts.architecture
    assert facts.cpu_vendor == fields["Vendor ID"]
    assert (facts.cpu_family, facts.cpu_model, facts.cpu_stepping) == (
        int(fields["CPU family"]), int(fields["Model"]), int(fields["Stepping"]),
    )  # fmt: skip
    assert facts.cpu_model_name == " ".join(fields["Model name"].split())
    assert facts.nested == ("Hypervisor vendor" in fields)
    if os.path.isdir("/sys/module/kvm_pvm"):  # these machines (docs/kvm-health.md)
        assert (facts.kvm_implementation, facts.kvm_hardware) == ("pvm", False)
