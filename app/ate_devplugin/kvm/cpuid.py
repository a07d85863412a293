"""The CPU a guest would see: KVM_GET_SUPPORTED_CPUID on the device, a digest of its feature
set, the notable features by name, and the registers a CPU profile is made of.

A micro-VM snapshot restores only where the guest sees the same CPU, so two devices whose
digests are equal can take each other's snapshots as far as CPUID goes. The digest covers
the vendor, the family/model/stepping signature and the registers that are feature flags,
and nothing that differs between two CPUs of one machine (APIC IDs, cache and topology
leaves, the brand string). It is KVM's answer, not /proc/cpuinfo's: a software KVM such
as PVM offers a guest far fewer features than the host has.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ate_devplugin.cpu import features
from ate_devplugin.cpu.features import EAX, EBX, ECX, EDX, FEATURE_REGISTERS, IDENTITY_REGISTERS, Bit, Register
from ate_devplugin.kvm import abi

# Room for this many entries first (the kernel's KVM_MAX_CPUID_ENTRIES is 256 today), more
# while it answers E2BIG, up to the last.
_FIRST_TRY = 256
MAX_ENTRIES = 1024
_REGISTER_NAMES = "abcd"


@dataclass(frozen=True)
class Entry:
    function: int
    index: int
    flags: int
    registers: tuple[int, int, int, int]  # eax, ebx, ecx, edx


def supported(kvm: int) -> tuple[Entry, ...]:
    """KVM_GET_SUPPORTED_CPUID on an open /dev/kvm (x86 only); raises OSError."""
    count = _FIRST_TRY
    while True:
        buffer = bytearray(struct.pack("=II", count, 0) + bytes(abi.CPUID_ENTRY2_SIZE * count))
        try:
            fcntl.ioctl(kvm, abi.GET_SUPPORTED_CPUID, buffer, True)
        except OSError as exc:
            if exc.errno == errno.E2BIG and count < MAX_ENTRIES:
                count *= 2
                continue
            raise
        (filled,) = struct.unpack_from("=I", buffer, 0)
        return tuple(_entry(buffer, i) for i in range(min(filled, count)))


def _entry(buffer: bytes | bytearray, i: int) -> Entry:
    offset = abi.CPUID2_HEADER + i * abi.CPUID_ENTRY2_SIZE
    function, index, flags, *registers = struct.unpack_from("=7I", buffer, offset)
    return Entry(function, index, flags, (registers[0], registers[1], registers[2], registers[3]))


# (leaf, subleaf, register): the feature-flag registers the digest covers, with the
# vendor string (leaf 0) and the signature (leaf 1 eax).
DIGESTED = (
    (0x0, 0, EBX), (0x0, 0, EDX), (0x0, 0, ECX),
    (0x1, 0, EAX), (0x1, 0, ECX), (0x1, 0, EDX),
    (0x6, 0, EAX),
    (0x7, 0, EBX), (0x7, 0, ECX), (0x7, 0, EDX), (0x7, 1, EAX), (0x7, 1, EDX), (0x7, 2, EDX),
    (0xD, 0, EAX), (0xD, 0, EDX), (0xD, 1, EAX),
    (0x80000001, 0, ECX), (0x80000001, 0, EDX), (0x80000007, 0, EDX), (0x80000008, 0, EBX),
    (0x40000001, 0, EAX),  # KVM's paravirtual features (kvmclock, async page faults, ...)
)  # fmt: skip

# The features VMMs and guest kernels select on, by their names (cpu/features.py): bounded
# on purpose, since each is a node label.
_NOTABLE = (
    "pclmulqdq", "vmx", "ssse3", "fma", "cx16", "pcid", "sse4_1", "sse4_2", "x2apic", "movbe", "popcnt",
    "tsc_deadline_timer", "aes", "xsave", "avx", "f16c", "rdrand", "hypervisor", "fsgsbase", "bmi1", "avx2",
    "smep", "bmi2", "invpcid", "rtm", "avx512f", "avx512dq", "rdseed", "adx", "smap", "avx512cd", "sha_ni",
    "avx512bw", "avx512vl", "umip", "pku", "gfni", "vaes", "vpclmulqdq", "avx512_vnni", "la57", "rdpid",
    "serialize", "amx_bf16", "avx512_fp16", "amx_tile", "amx_int8", "avx_vnni", "avx512_bf16", "xsaveopt",
    "xsaves", "svm", "pdpe1gb", "rdtscp", "invtsc",
)  # fmt: skip
# lzcnt has been labelled so from the start; /proc/cpuinfo says abm.
NOTABLE: Mapping[str, Bit] = {name: features.FEATURES[name] for name in _NOTABLE} | {"lzcnt": features.FEATURES["abm"]}


def _register(entries: Iterable[Entry], leaf: int, subleaf: int, register: int) -> int:
    """A register of a leaf; 0 for a leaf KVM does not offer. Leaves without subleaves
    (KVM_CPUID_FLAG_SIGNIFCANT_INDEX clear) answer every subleaf alike."""
    for e in entries:
        if e.function == leaf and (e.index == subleaf or not e.flags & 1):
            return e.registers[register]
    return 0


def digest(entries: Iterable[Entry]) -> str:
    """32 hex digits of SHA-256 over the digested registers, in a fixed order."""
    entries = tuple(entries)
    text = "\n".join(
        f"{leaf:#x}.{subleaf}.e{_REGISTER_NAMES[r]}x={_register(entries, leaf, subleaf, r):#010x}"
        for leaf, subleaf, r in DIGESTED
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def registers(entries: Iterable[Entry]) -> dict[Register, int]:
    """The registers a CPU profile is made of (cpu/features.py): the vendor, the signature
    and the feature flags; those that are 0 are left out."""
    entries = tuple(entries)
    found = {r: _register(entries, r.leaf, r.subleaf, r.register) for r in (*IDENTITY_REGISTERS, *FEATURE_REGISTERS)}
    return {r: value for r, value in found.items() if value}


def notable(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The notable features a guest would see, sorted by name."""
    found = registers(entries)
    return tuple(sorted(name for name, b in NOTABLE.items() if found.get(b.register, 0) >> b.bit & 1))
