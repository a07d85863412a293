"""The CPU a guest would see: KVM_GET_SUPPORTED_CPUID on the device, a digest of its feature
set, and the notable features by name.

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

from ate_devplugin.kvm import abi

# Room for this many entries first (the kernel's KVM_MAX_CPUID_ENTRIES is 256 today), more
# while it answers E2BIG, up to the last.
_FIRST_TRY = 256
MAX_ENTRIES = 1024
EAX, EBX, ECX, EDX = range(4)
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

# Names as /proc/cpuinfo spells them: (leaf, subleaf, register, bit). Bounded on purpose:
# the features VMMs and guest kernels select on, not every flag.
NOTABLE: Mapping[str, tuple[int, int, int, int]] = {
    "pclmulqdq": (0x1, 0, ECX, 1),
    "vmx": (0x1, 0, ECX, 5),
    "ssse3": (0x1, 0, ECX, 9),
    "fma": (0x1, 0, ECX, 12),
    "cx16": (0x1, 0, ECX, 13),
    "pcid": (0x1, 0, ECX, 17),
    "sse4_1": (0x1, 0, ECX, 19),
    "sse4_2": (0x1, 0, ECX, 20),
    "x2apic": (0x1, 0, ECX, 21),
    "movbe": (0x1, 0, ECX, 22),
    "popcnt": (0x1, 0, ECX, 23),
    "tsc_deadline_timer": (0x1, 0, ECX, 24),
    "aes": (0x1, 0, ECX, 25),
    "xsave": (0x1, 0, ECX, 26),
    "avx": (0x1, 0, ECX, 28),
    "f16c": (0x1, 0, ECX, 29),
    "rdrand": (0x1, 0, ECX, 30),
    "hypervisor": (0x1, 0, ECX, 31),
    "fsgsbase": (0x7, 0, EBX, 0),
    "bmi1": (0x7, 0, EBX, 3),
    "avx2": (0x7, 0, EBX, 5),
    "smep": (0x7, 0, EBX, 7),
    "bmi2": (0x7, 0, EBX, 8),
    "invpcid": (0x7, 0, EBX, 10),
    "rtm": (0x7, 0, EBX, 11),
    "avx512f": (0x7, 0, EBX, 16),
    "avx512dq": (0x7, 0, EBX, 17),
    "rdseed": (0x7, 0, EBX, 18),
    "adx": (0x7, 0, EBX, 19),
    "smap": (0x7, 0, EBX, 20),
    "avx512cd": (0x7, 0, EBX, 28),
    "sha_ni": (0x7, 0, EBX, 29),
    "avx512bw": (0x7, 0, EBX, 30),
    "avx512vl": (0x7, 0, EBX, 31),
    "umip": (0x7, 0, ECX, 2),
    "pku": (0x7, 0, ECX, 3),
    "gfni": (0x7, 0, ECX, 8),
    "vaes": (0x7, 0, ECX, 9),
    "vpclmulqdq": (0x7, 0, ECX, 10),
    "avx512_vnni": (0x7, 0, ECX, 11),
    "la57": (0x7, 0, ECX, 16),
    "rdpid": (0x7, 0, ECX, 22),
    "serialize": (0x7, 0, EDX, 14),
    "amx_bf16": (0x7, 0, EDX, 22),
    "avx512_fp16": (0x7, 0, EDX, 23),
    "amx_tile": (0x7, 0, EDX, 24),
    "amx_int8": (0x7, 0, EDX, 25),
    "avx_vnni": (0x7, 1, EAX, 4),
    "avx512_bf16": (0x7, 1, EAX, 5),
    "xsaveopt": (0xD, 1, EAX, 0),
    "xsaves": (0xD, 1, EAX, 3),
    "svm": (0x80000001, 0, ECX, 2),
    "lzcnt": (0x80000001, 0, ECX, 5),
    "pdpe1gb": (0x80000001, 0, EDX, 26),
    "rdtscp": (0x80000001, 0, EDX, 27),
    "invtsc": (0x80000007, 0, EDX, 8),
}


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


def notable(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The notable features a guest would see, sorted by name."""
    entries = tuple(entries)
    return tuple(
        sorted(name for name, (leaf, sub, r, bit) in NOTABLE.items() if _register(entries, leaf, sub, r) >> bit & 1)
    )
