"""The node's virtualisation facts: what a scheduler needs to place a VM worker.

Two kinds, learned by different processes:

* :class:`NodeFacts`, from ``/proc`` and ``/sys``, which the unprivileged daemon can read
  (both are injected, so the tests read trees of their own): architecture, the CPU's
  vendor, family/model/stepping and model name, whether the node is itself a VM (the
  ``hypervisor`` flag), which KVM implementation is loaded, and the kernel release;
* :class:`DeviceFacts`, from the KVM device, which only a process granted it can open (the
  probe learns them): the KVM API version, the CPUID a guest would see (a digest, the
  notable features and the registers a CPU profile is made of), the TSC frequency of a new
  vCPU and a few capabilities VMMs check before they start.

:func:`cpu_profile` makes the node's guest CPU profile (cpu/profile.py) of both.

Which implementation serves ``/dev/kvm`` is read from the loaded modules: ``kvm_intel``
is hardware VMX, ``kvm_amd`` hardware SVM, ``kvm_pvm`` PVM, a software (page-table based)
virtualisation that needs no VMX; on arm64 KVM is built into the kernel. When more than
one x86 implementation is loaded the device's owner cannot be told from here, and the
answer names them all and is not counted as hardware.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ate_devplugin.cpu import features
from ate_devplugin.cpu.features import Register
from ate_devplugin.cpu.profile import CpuProfile, Tsc
from ate_devplugin.kvm import abi, cpuid

MAX_CPUINFO_BYTES = 1 << 20  # the first processor's block is a few KiB; a machine with 400 CPUs, ~1 MiB
# Kubernetes' names for the architectures (kubernetes.io/arch), from the kernel's.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}
# The x86 KVM modules and the implementation each is.
X86_IMPLEMENTATIONS = {"kvm_intel": "vmx", "kvm_amd": "svm", "kvm_pvm": "pvm"}
HARDWARE = frozenset({"vmx", "svm", "arm64"})
# arm64 CPU implementer codes (MIDR_EL1) of the vendors one meets in clusters.
ARM_IMPLEMENTERS = {
    0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon", 0x4E: "NVIDIA",
    0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft", 0xC0: "Ampere",
}  # fmt: skip


@dataclass(frozen=True)
class NodeFacts:
    architecture: str  # Kubernetes' name: amd64, arm64, ...
    cpu_vendor: str  # GenuineIntel, AuthenticAMD, or the arm64 implementer
    cpu_family: int | None
    cpu_model: int | None
    cpu_stepping: int | None
    cpu_model_name: str
    nested: bool  # the node is itself a VM (the CPU's hypervisor flag)
    kvm_implementation: str  # vmx, svm, pvm, arm64, several joined by "+", or "" when none is loaded
    kernel_release: str

    @property
    def kvm_hardware(self) -> bool:
        """Whether the device is served by the CPU's own virtualisation extensions."""
        return self.kvm_implementation in HARDWARE

    def to_json(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "cpu_vendor": self.cpu_vendor,
            "cpu_family": self.cpu_family,
            "cpu_model": self.cpu_model,
            "cpu_stepping": self.cpu_stepping,
            "cpu_model_name": self.cpu_model_name,
            "nested": self.nested,
            "kvm_implementation": self.kvm_implementation,
            "kvm_hardware": self.kvm_hardware,
            "kernel_release": self.kernel_release,
        }


def _read(path: str, limit: int = 4096) -> str:
    """The start of a small text file; empty when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _first_cpu(cpuinfo: str) -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo as a dict (arm64 puts some fields after
    the blocks: they are read too)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and key not in fields:
            fields[key] = value.strip()
    return fields


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text else None
    except ValueError:
        return None


def implementation(sys_root: str, architecture: str) -> str:
    """Which KVM implementation is loaded, from ``<sys_root>/module``."""
    if architecture == "arm64":
        return "arm64" if os.path.isdir(f"{sys_root}/module/kvm") else ""
    loaded = [name for module, name in X86_IMPLEMENTATIONS.items() if os.path.isdir(f"{sys_root}/module/{module}")]
    return "+".join(sorted(loaded))


def read_node_facts(proc_root: str = "/proc", sys_root: str = "/sys") -> NodeFacts:
    machine = _read(f"{proc_root}/sys/kernel/arch").strip() or os.uname().machine
    architecture = ARCHITECTURES.get(machine, machine)
    cpu = _first_cpu(_read(f"{proc_root}/cpuinfo", MAX_CPUINFO_BYTES))
    if "vendor_id" in cpu or architecture == "amd64":
        vendor = cpu.get("vendor_id", "")
        family, model, stepping = _int(cpu.get("cpu family")), _int(cpu.get("model")), _int(cpu.get("stepping"))
        name = cpu.get("model name", "")
        nested = "hypervisor" in cpu.get("flags", "").split()
    else:  # arm64's fields: implementer, part (the model), variant and revision
        implementer = _int(cpu.get("CPU implementer"), 16)
        vendor = ARM_IMPLEMENTERS.get(implementer, f"0x{implementer:02x}") if implementer is not None else ""
        family = _int(cpu.get("CPU architecture"))
        model = _int(cpu.get("CPU part"), 16)
        stepping = _int(cpu.get("CPU revision"))
        name = cpu.get("model name", "")
        # arm64 has no hypervisor flag a guest can read in /proc/cpuinfo; a device tree or
        # DMI answer would be a guess, so it says no.
        nested = False
    return NodeFacts(
        architecture=architecture,
        cpu_vendor=vendor,
        cpu_family=family,
        cpu_model=model,
        cpu_stepping=stepping,
        cpu_model_name=" ".join(name.split()),
        nested=nested,
        kvm_implementation=implementation(sys_root, architecture),
        kernel_release=_read(f"{proc_root}/sys/kernel/osrelease").strip() or os.uname().release,
    )


# --- learned from the device ------------------------------------------------------

# KVM_CHECK_EXTENSION: what a VMM checks before it starts, and why it matters for placement.
CAPABILITIES = {
    "max_vcpus": abi.CAP_MAX_VCPUS,  # the largest VM the device takes
    "max_memslots": abi.CAP_NR_MEMSLOTS,  # memory regions (hot-plug, virtio-mem, DAX windows)
    "irqchip": abi.CAP_IRQCHIP,  # in-kernel interrupt controller (Firecracker, QEMU)
    "split_irqchip": abi.CAP_SPLIT_IRQCHIP,  # in-kernel LAPIC, IOAPIC in the VMM (Cloud Hypervisor, QEMU q35)
    "irqfd": abi.CAP_IRQFD,  # interrupts from eventfds: virtio and vhost without a VMM round trip
    "ioeventfd": abi.CAP_IOEVENTFD,  # doorbells to eventfds: the same the other way
    "immediate_exit": abi.CAP_IMMEDIATE_EXIT,  # pausing vCPUs for a snapshot without signals racing KVM_RUN
    "tsc_control": abi.CAP_TSC_CONTROL,  # TSC scaling: restoring a snapshot taken at another TSC frequency
    "user_memory": abi.CAP_USER_MEMORY,
}


@dataclass(frozen=True)
class DeviceFacts:
    api_version: int
    capabilities: Mapping[str, int] = field(default_factory=dict)  # name (CAPABILITIES) -> KVM's answer
    cpuid_digest: str = ""  # "" where KVM_GET_SUPPORTED_CPUID does not exist (not x86) or failed
    cpu_features: tuple[str, ...] = ()
    # What a CPU profile is made of (cpu/profile.py): the supported CPUID's vendor, signature
    # and feature registers (cpuid.registers), and the TSC frequency of a new vCPU. A prober
    # older than profiles sends neither.
    cpuid_registers: Mapping[Register, int] = field(default_factory=dict)
    tsc_khz: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "api_version": self.api_version,
            "capabilities": dict(self.capabilities),
            "cpuid_digest": self.cpuid_digest,
            "cpu_features": list(self.cpu_features),
            "cpuid_registers": {r.key(): v for r, v in sorted(self.cpuid_registers.items())},
            "tsc_khz": self.tsc_khz,
        }


def read_device_facts(kvm: int, api_version: int) -> DeviceFacts:
    """What the open device says of itself; a capability it refuses to answer is left out.
    The TSC frequency needs a vCPU: the probe adds it (:func:`read_tsc_khz`)."""
    capabilities: dict[str, int] = {}
    for name, number in CAPABILITIES.items():
        with contextlib.suppress(OSError):
            capabilities[name] = fcntl.ioctl(kvm, abi.CHECK_EXTENSION, number)
    try:
        entries = cpuid.supported(kvm)
    except OSError:  # not x86 (ENOTTY/EINVAL), or refused: the facts say nothing of the CPUID
        return DeviceFacts(api_version, capabilities)
    registers = cpuid.registers(entries)
    return DeviceFacts(api_version, capabilities, cpuid.digest(entries), cpuid.notable(entries), registers)


def read_tsc_khz(vcpu: int) -> int | None:
    """KVM_GET_TSC_KHZ on a new vCPU: the TSC frequency a VM gets here unless its VMM asks for
    another, which is what a VMM records in a snapshot (Firecracker's vCPU state keeps it) and
    asks for again on restore. None where the ioctl fails or says 0."""
    try:
        return fcntl.ioctl(vcpu, abi.GET_TSC_KHZ) or None
    except OSError:
        return None


def cpu_profile(node: NodeFacts, device: DeviceFacts) -> CpuProfile:
    """The node's guest CPU profile: the device's CPUID and TSC, the node's architecture,
    KVM implementation and names."""
    registers = device.cpuid_registers
    family, model, stepping = features.signature(registers) or (None, None, None)
    return CpuProfile(
        architecture=node.architecture,
        vendor=features.vendor(registers),
        family=family,
        model=model,
        stepping=stepping,
        registers={r: v for r, v in registers.items() if r in features.FEATURE_REGISTERS},
        tsc=Tsc(device.tsc_khz, device.capabilities.get("tsc_control", 0) > 0),
        kvm_implementation=node.kvm_implementation,
        cpu_model_name=node.cpu_model_name,
        kernel_release=node.kernel_release,
    )
