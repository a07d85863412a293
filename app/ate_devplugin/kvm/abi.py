"""The kernel's KVM interface as numbers: ioctl requests, exit reasons, capability numbers
and the offsets of ``struct kvm_run`` (from the kernel's uapi ``linux/kvm.h``, x86-64).

Only what the probe and the facts use. The ioctl request numbers follow the kernel's
``_IO``/``_IOR``/``_IOW``/``_IOWR`` encoding: direction in bits 30-31, argument size in
bits 16-29, the KVM type 0xAE in bits 8-15 and the number in bits 0-7.
"""

from __future__ import annotations

KVMIO = 0xAE
API_VERSION = 12  # the only stable KVM API version there has ever been


def _io(nr: int) -> int:
    return (KVMIO << 8) | nr


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (KVMIO << 8) | nr


def _ior(nr: int, size: int) -> int:
    return (2 << 30) | (size << 16) | (KVMIO << 8) | nr


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (KVMIO << 8) | nr


SREGS_SIZE = 312  # struct kvm_sregs: 8 segments, 2 descriptor tables, 7 registers, the interrupt bitmap
REGS_SIZE = 144  # struct kvm_regs: 18 u64
MEMORY_REGION_SIZE = 32  # struct kvm_userspace_memory_region: slot, flags, guest address, size, user address
CPUID2_HEADER = 8  # struct kvm_cpuid2: nent, padding
CPUID_ENTRY2_SIZE = 40  # struct kvm_cpuid_entry2: function, index, flags, eax..edx, 3 u32 of padding

# On /dev/kvm
GET_API_VERSION = _io(0x00)
CREATE_VM = _io(0x01)
CHECK_EXTENSION = _io(0x03)
GET_VCPU_MMAP_SIZE = _io(0x04)
GET_SUPPORTED_CPUID = _iowr(0x05, CPUID2_HEADER)
# On a VM
CREATE_VCPU = _io(0x41)
SET_USER_MEMORY_REGION = _iow(0x46, MEMORY_REGION_SIZE)
# On a vCPU
RUN = _io(0x80)
SET_REGS = _iow(0x82, REGS_SIZE)
GET_SREGS = _ior(0x83, SREGS_SIZE)
SET_SREGS = _iow(0x84, SREGS_SIZE)
GET_TSC_KHZ = _io(0xA3)  # the vCPU's TSC frequency in kHz, as the return value

# struct kvm_run: where the fields the probe reads are
RUN_EXIT_REASON = 8  # u32
RUN_EXIT_DATA = 32  # the union that follows depends on the exit reason
# KVM_EXIT_IO: direction u8, size u8, port u16, count u32, data_offset u64 (from the start of kvm_run)
IO_FORMAT = "=BBHIQ"
IO_OUT = 1
# KVM_EXIT_FAIL_ENTRY: hardware_entry_failure_reason u64, cpu u32
# KVM_EXIT_INTERNAL_ERROR: suberror u32, ndata u32, data u64[16]
# KVM_EXIT_UNKNOWN: hardware_exit_reason u64

EXIT_UNKNOWN = 0
EXIT_IO = 2
EXIT_HLT = 5
EXIT_SHUTDOWN = 8
EXIT_FAIL_ENTRY = 9
EXIT_INTR = 10
EXIT_INTERNAL_ERROR = 17
EXIT_NAMES = {
    0: "UNKNOWN", 1: "EXCEPTION", 2: "IO", 3: "HYPERCALL", 4: "DEBUG", 5: "HLT", 6: "MMIO",
    7: "IRQ_WINDOW_OPEN", 8: "SHUTDOWN", 9: "FAIL_ENTRY", 10: "INTR", 11: "SET_TPR", 12: "TPR_ACCESS",
    16: "NMI", 17: "INTERNAL_ERROR", 24: "SYSTEM_EVENT", 26: "IOAPIC_EOI", 27: "HYPERV",
    29: "X86_RDMSR", 30: "X86_WRMSR", 31: "DIRTY_RING_FULL", 33: "X86_BUS_LOCK", 34: "XEN",
    37: "NOTIFY", 39: "MEMORY_FAULT",
}  # fmt: skip
# KVM_EXIT_INTERNAL_ERROR's suberror
INTERNAL_ERROR_NAMES = {
    1: "emulation failure",
    2: "exception while handling an exception",
    3: "event delivery failed",
    4: "unexpected exit reason",
}


def exit_name(reason: int) -> str:
    return "KVM_EXIT_" + EXIT_NAMES.get(reason, str(reason))


# KVM_CHECK_EXTENSION capabilities the facts report (docs/kvm-health.md says why these)
CAP_IRQCHIP = 0
CAP_USER_MEMORY = 3
CAP_NR_MEMSLOTS = 10
CAP_IRQFD = 32
CAP_IOEVENTFD = 36
CAP_TSC_CONTROL = 60
CAP_MAX_VCPUS = 66
CAP_SPLIT_IRQCHIP = 121
CAP_IMMEDIATE_EXIT = 136
