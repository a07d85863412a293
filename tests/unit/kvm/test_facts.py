"""The node's facts from /proc and /sys trees of the test's own (Intel under PVM as on these
machines, AMD and Intel hardware, two implementations loaded, arm64, nothing readable),
the CPUID digest and features from entries, the facts as attributes and labels, and the
CPU profile's part of the facts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ate_devplugin.config import MAX_PATH_CHARS
from ate_devplugin.cpu.features import EAX, EBX, FEATURE_REGISTERS, IDENTITY_REGISTERS, Register
from ate_devplugin.cpu.profile import Tsc
from ate_devplugin.kvm import cpuid, wire
from ate_devplugin.kvm.attributes import Version, attributes, kernel_version
from ate_devplugin.kvm.cpuid import Entry
from ate_devplugin.kvm.facts import CAPABILITIES, DeviceFacts, NodeFacts, cpu_profile, read_node_facts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

# The start of /proc/cpuinfo on these machines (and what another vendor's looks like).
INTEL_UNDER_PVM = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R)   Processor
stepping\t: 1
flags\t\t: fpu vme de pse tsc msr cx16 x2apic hypervisor lahf_lm

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another CPU's line is never read
"""
AMD_BARE_METAL = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7763 64-Core Processor
stepping\t: 1
flags\t\t: fpu vme svm lm
"""
ARM64 = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


def tree(root: Path, arch: str, cpuinfo: str, modules: tuple[str, ...], release: str = "6.1.0-57-cloud-amd64") -> None:
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/arch").write_text(arch + "\n")
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")
    (root / "proc/cpuinfo").write_text(cpuinfo)
    for module in modules:
        (root / "sys/module" / module / "parameters").mkdir(parents=True)


def facts(root: Path) -> NodeFacts:
    return read_node_facts(str(root / "proc"), str(root / "sys"))


def test_these_machines_an_intel_vm_whose_kvm_is_pvm(tmp_path: Path) -> None:
    tree(tmp_path, "x86_64", INTEL_UNDER_PVM, ("kvm", "kvm_pvm"), "6.18.44-fc-v1147")
    assert facts(tmp_path) == NodeFacts(
        architecture="amd64",
        cpu_vendor="GenuineIntel",
        cpu_family=6,
        cpu_model=167,
        cpu_stepping=1,
        cpu_model_name="Intel(R) Xeon(R) Processor",
        nested=True,
        kvm_implementation="pvm",
        kernel_release="6.18.44-fc-v1147",
    )
    assert facts(tmp_path).kvm_hardware is False


@pytest.mark.parametrize(
    ("cpuinfo", "modules", "implementation", "hardware", "nested"),
    [
        (AMD_BARE_METAL, ("kvm", "kvm_amd"), "svm", True, False),
        (INTEL_UNDER_PVM, ("kvm", "kvm_intel"), "vmx", True, True),  # nested virtualisation in a cloud VM
        (INTEL_UNDER_PVM, ("kvm", "kvm_intel", "kvm_pvm"), "pvm+vmx", False, True),  # which one serves: unknown
        (AMD_BARE_METAL, ("kvm",), "", False, False),  # kvm alone: no vendor module, no device
    ],
)
def test_the_kvm_implementation_is_the_loaded_module(
    tmp_path: Path, cpuinfo: str, modules: tuple[str, ...], implementation: str, hardware: bool, nested: bool
) -> None:
    tree(tmp_path, "x86_64", cpuinfo, modules)
    found = facts(tmp_path)
    assert (found.kvm_implementation, found.kvm_hardware, found.nested) == (implementation, hardware, nested)


def test_arm64_reads_the_implementer_and_part(tmp_path: Path) -> None:
    tree(tmp_path, "aarch64", ARM64, ("kvm",))
    found = facts(tmp_path)
    assert (found.architecture, found.cpu_vendor, found.cpu_family, found.cpu_model, found.cpu_stepping) == (
        "arm64", "ARM", 8, 0xD0C, 1,
    )  # fmt: skip
    assert (found.cpu_model_name, found.nested, found.kvm_implementation, found.kvm_hardware) == (
        "",
        False,
        "arm64",
        True,
    )


def test_what_cannot_be_read_is_unknown_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/arch").write_text("x86_64\n")
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0\n")
    found = facts(tmp_path)
    assert (found.cpu_vendor, found.cpu_family, found.cpu_model, found.cpu_model_name) == ("", None, None, "")
    assert (found.kvm_implementation, found.nested) == ("", False)


# --- CPUID ------------------------------------------------------------------------

ENTRIES = (
    Entry(0x0, 0, 0, (0x24, 0x756E6547, 0x6C65746E, 0x49656E69)),
    Entry(0x1, 0, 0, (0xA0671, 0x20800, 0x81202000, 0xF8BFBFF)),
    Entry(0x7, 0, 1, (0x2, 0x1802852, 0x1A010104, 0x20010000)),
    Entry(0x7, 1, 1, (0x1C00, 0x0, 0x0, 0x4000)),
    Entry(0x80000001, 0, 0, (0x0, 0x0, 0x101, 0x20100800)),
    Entry(0x80000007, 0, 0, (0x0, 0x0, 0x0, 0x100)),
)  # KVM_GET_SUPPORTED_CPUID on these machines (PVM), in part


def test_the_notable_features_are_named_as_proc_cpuinfo_names_them() -> None:
    assert cpuid.notable(ENTRIES) == (
        "cx16", "gfni", "hypervisor", "invtsc", "la57", "rtm", "tsc_deadline_timer", "umip", "x2apic"
    )  # fmt: skip


def test_the_digest_follows_the_features_and_the_signature_not_the_apic_id() -> None:
    base = cpuid.digest(ENTRIES)
    assert len(base) == 32
    assert int(base, 16) >= 0
    other_cpu = list(ENTRIES)
    other_cpu[1] = Entry(0x1, 0, 0, (0xA0671, 0x03020800, 0x81202000, 0xF8BFBFF))  # APIC ID 3 in ebx
    assert cpuid.digest(other_cpu) == base
    more = list(ENTRIES)
    more[2] = Entry(0x7, 0, 1, (0x2, 0x1802852 | 1 << 5, 0x1A010104, 0x20010000))  # avx2 offered
    assert cpuid.digest(more) != base
    stepping = list(ENTRIES)
    stepping[1] = Entry(0x1, 0, 0, (0xA0672, 0x20800, 0x81202000, 0xF8BFBFF))
    assert cpuid.digest(stepping) != base
    assert cpuid.digest(reversed(ENTRIES)) == base  # the order KVM lists them in does not matter


# --- attributes -------------------------------------------------------------------

NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc-v1147")
DEVICE = DeviceFacts(
    12,
    {"max_vcpus": 1024, "max_memslots": 32764, "irqchip": 1, "split_irqchip": 1, "irqfd": 1, "ioeventfd": 1,
     "immediate_exit": 1, "tsc_control": 0, "user_memory": 1},
    "e4da580d0f0efc260d1b9abad8ce7814",
    ("cx16", "x2apic"),
)  # fmt: skip


def test_the_attributes_of_these_machines() -> None:
    assert attributes(NODE, DEVICE) == {
        "architecture": "amd64",
        "cpuVendor": "GenuineIntel",
        "cpuFamily": 6,
        "cpuModel": 167,
        "cpuStepping": 1,
        "cpuModelName": "Intel(R) Xeon(R) Processor",
        "nested": True,
        "kvmImplementation": "pvm",
        "kvmHardware": False,
        "kernelRelease": "6.18.44-fc-v1147",
        "kernelVersion": Version("6.18.44"),
        "kvmApiVersion": 12,
        "cpuidDigest": "e4da580d0f0efc260d1b9abad8ce7814",
        "kvmMaxVcpus": 1024,
        "kvmMaxMemslots": 32764,
        "kvmIrqchip": True,
        "kvmSplitIrqchip": True,
        "kvmIrqfd": True,
        "kvmIoeventfd": True,
        "kvmImmediateExit": True,
        "kvmTscControl": False,
    }


def test_before_a_probe_only_the_node_facts_and_unknowns_are_left_out() -> None:
    arm = NodeFacts("arm64", "ARM", 8, 0xD0C, None, "", False, "arm64", "6.1.0")
    found = attributes(arm)
    assert not {"kvmApiVersion", "cpuStepping", "cpuModelName"} & set(found)
    assert (found["kvmHardware"], found["kernelVersion"]) == (True, Version("6.1.0"))
    assert attributes(NODE, DeviceFacts(12))["kvmApiVersion"] == 12
    assert "kvmIrqchip" not in attributes(NODE, DeviceFacts(12))  # a capability not answered


@pytest.mark.parametrize(
    ("release", "version"),
    [("6.1.0-57-cloud-amd64", "6.1.0"), ("5.10", "5.10.0"), ("6.18.44-fc-v1147", "6.18.44"), ("4.19.0+", "4.19.0"),
     ("06.01.02", "6.1.2")],
)  # fmt: skip
def test_the_kernel_version_is_the_numeric_release(release: str, version: str) -> None:
    assert kernel_version(release) == Version(version)


def test_a_release_without_numbers_has_no_version() -> None:
    assert kernel_version("custom") is None
    assert "kernelVersion" not in attributes(NodeFacts("amd64", "", None, None, None, "", False, "", "custom"))


# --- the CPU profile's part -------------------------------------------------------


def test_the_registers_of_a_profile_are_the_identity_and_the_covered_ones_set() -> None:
    found = cpuid.registers(ENTRIES)
    assert found[Register(0x7, 0, EBX)] == 0x1802852
    assert found[Register(0x0, 0, EBX)] == 0x756E6547  # "Genu"
    assert Register(0x1, 0, EBX) not in found  # the APIC ID and CLFLUSH size: no feature
    assert Register(0x7, 1, EBX) not in found  # 0: left out
    assert Register(0x0, 0, EAX) not in found  # the highest leaf: no feature either


def test_the_cpu_profile_of_these_machines_facts() -> None:
    device = DeviceFacts(12, {"tsc_control": 0}, cpuid.digest(ENTRIES), cpuid.notable(ENTRIES),
                         cpuid.registers(ENTRIES), 2599998)  # fmt: skip
    made = cpu_profile(NODE, device)
    assert (made.architecture, made.vendor) == ("amd64", "GenuineIntel")
    assert (made.family, made.model, made.stepping) == (6, 167, 1)
    assert (made.tsc, made.invariant_tsc, made.kvm_implementation) == (Tsc(2599998, False), True, "pvm")
    assert set(cpuid.notable(ENTRIES)) <= made.features
    assert Register(0x0, 0, EBX) not in made.registers  # the vendor is said as text, not a feature register
    assert cpu_profile(NODE, replace(device, capabilities={"tsc_control": 1})).tsc.scaling
    assert not cpu_profile(NODE, DeviceFacts(12)).has_cpuid  # arm64, or a prober before profiles


def test_the_device_facts_go_through_json_and_an_older_probers_read_too() -> None:
    """As the daemon reads them, in a prober's report (kvm/wire.py)."""

    def read(facts: dict[str, Any]) -> DeviceFacts | None:
        result = {**ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.0).to_json(), "device_facts": facts}
        message = wire.decode(json.dumps({"v": wire.VERSION, "report": {"resource": "r", "result": result}}).encode())
        assert isinstance(message, wire.Report)
        return message.result.device_facts

    device = DeviceFacts(12, {"max_vcpus": 1024}, "0" * 32, ("cx16",), cpuid.registers(ENTRIES), 2599998)
    assert read(json.loads(json.dumps(device.to_json()))) == device
    older = {"api_version": 12, "capabilities": {"max_vcpus": 1024}, "cpuid_digest": "0" * 32, "cpu_features": ["cx16"]}
    assert read(older) == DeviceFacts(12, {"max_vcpus": 1024}, "0" * 32, ("cx16",))
    with pytest.raises(ValueError, match="not a CPUID register"):
        read({**older, "cpuid_registers": {"leaf 7": 1}})


def test_the_largest_probe_result_stays_far_inside_the_probers_line() -> None:
    """Every register a profile reads with every bit set, the longest device path the config
    takes and every notable feature: the result's line against the 64 KiB bound (kvm/wire.py:
    the pipe and the socket)."""
    full = dict.fromkeys((*IDENTITY_REGISTERS, *FEATURE_REGISTERS), 4294967295)
    device = DeviceFacts(12, dict.fromkeys(CAPABILITIES, 2**31), "f" * 32, tuple(cpuid.NOTABLE), full, 2**32 - 1)
    path = "/dev/" + "d" * (MAX_PATH_CHARS - 5)
    result = ProbeResult(path, Reason.PASSED, "m" * 200, 5.0, "10:232", 12, ("hlt",) * 8, True, device)
    line = json.dumps(result.to_json()).encode()
    assert len(line) < wire.MAX_LINE // 8, len(line)
