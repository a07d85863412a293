"""The facts as typed, named attributes: one set of names for the DRA devices
(``dra/attributes.py`` writes them into the slice) and for the node labels of device-plugin
mode (``nfd.py``).

Names are C identifiers of at most 32 characters (the limit of a DRA attribute's name), in
the driver's domain: ``ate.dev/cpuModel`` as a label, ``device.attributes["ate.dev"].cpuModel``
in a DRA selector. A fact that is unknown is left out, never guessed: the device facts
(API version, CPUID, capabilities) appear once a probe has learned them.

=====================  =======  ==========================================================
name                   type     from
=====================  =======  ==========================================================
architecture           string   kernel architecture, Kubernetes' spelling (amd64, arm64)
cpuVendor              string   /proc/cpuinfo vendor_id (arm64: the implementer)
cpuFamily              int      /proc/cpuinfo cpu family (arm64: CPU architecture)
cpuModel               int      /proc/cpuinfo model (arm64: CPU part)
cpuStepping            int      /proc/cpuinfo stepping (arm64: CPU revision)
cpuModelName           string   /proc/cpuinfo model name, spaces squeezed
nested                 bool     the node is a VM (the hypervisor CPU flag)
kvmImplementation      string   vmx, svm, pvm, arm64 (the loaded KVM module)
kvmHardware            bool     vmx, svm or arm64: the CPU's own virtualisation
kernelRelease          string   /proc/sys/kernel/osrelease
kernelVersion          version  its major.minor.patch, for semver comparisons
kvmApiVersion          int      KVM_GET_API_VERSION (probe)
cpuidDigest            string   digest of the guest's CPUID feature set (probe, x86)
kvmMaxVcpus            int      KVM_CAP_MAX_VCPUS (probe)
kvmMaxMemslots         int      KVM_CAP_NR_MEMSLOTS (probe)
kvmIrqchip             bool     KVM_CAP_IRQCHIP (probe)
kvmSplitIrqchip        bool     KVM_CAP_SPLIT_IRQCHIP (probe)
kvmIrqfd               bool     KVM_CAP_IRQFD (probe)
kvmIoeventfd           bool     KVM_CAP_IOEVENTFD (probe)
kvmImmediateExit       bool     KVM_CAP_IMMEDIATE_EXIT (probe)
kvmTscControl          bool     KVM_CAP_TSC_CONTROL (probe)
=====================  =======  ==========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts

MAX_STRING = 64  # a DRA string or version attribute's limit
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class Version:
    """A semantic version (semver.org 2.0.0), e.g. ``6.18.44``."""

    text: str


Value = bool | int | str | Version

# (attribute, capability in DeviceFacts.capabilities, as bool)
_CAPABILITIES = (
    ("kvmMaxVcpus", "max_vcpus", False),
    ("kvmMaxMemslots", "max_memslots", False),
    ("kvmIrqchip", "irqchip", True),
    ("kvmSplitIrqchip", "split_irqchip", True),
    ("kvmIrqfd", "irqfd", True),
    ("kvmIoeventfd", "ioeventfd", True),
    ("kvmImmediateExit", "immediate_exit", True),
    ("kvmTscControl", "tsc_control", True),
)


def kernel_version(release: str) -> Version | None:
    """``6.1.0-57-cloud-amd64`` -> ``6.1.0``: the numeric part only, since a semver
    pre-release suffix would order ``6.1.0-57`` before ``6.1.0``."""
    match = _RELEASE.match(release)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return Version(f"{int(major)}.{int(minor)}.{int(patch or 0)}")


def attributes(node: NodeFacts, device: DeviceFacts | None = None) -> dict[str, Value]:
    """The attributes of what is known, in the table's order."""
    found: dict[str, Value | None] = {
        "architecture": node.architecture,
        "cpuVendor": node.cpu_vendor,
        "cpuFamily": node.cpu_family,
        "cpuModel": node.cpu_model,
        "cpuStepping": node.cpu_stepping,
        "cpuModelName": node.cpu_model_name[:MAX_STRING],
        "nested": node.nested,
        "kvmImplementation": node.kvm_implementation,
        "kvmHardware": node.kvm_hardware,
        "kernelRelease": node.kernel_release[:MAX_STRING],
        "kernelVersion": kernel_version(node.kernel_release),
    }
    if device is not None:
        found["kvmApiVersion"] = device.api_version
        found["cpuidDigest"] = device.cpuid_digest
        for name, capability, as_bool in _CAPABILITIES:
            value = device.capabilities.get(capability)
            found[name] = None if value is None else (value > 0 if as_bool else value)
    return {name: value for name, value in found.items() if value is not None and value != ""}
