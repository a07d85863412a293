"""A micro-VM on /dev/kvm driven from Python: what a VM worker needs of the device, beyond
opening it, at the cost of a few milliseconds (the kubelet bench tests run it on the node
the kubelet hands a container; the e2e suite runs a real VMM, tests/e2e/vmm.py).

It creates a VM (KVM_CREATE_VM), gives it one page of memory at guest address 0x1000 and a
vCPU in real mode, and runs twelve bytes of guest code that add 2 and 2, write the digit to
the serial port 0x3f8 (a port-I/O exit), write a newline, and halt. The exits it sees are
returned: ``{"exits": [["io", 1016, "4"], ["io", 1016, "\\n"], ["hlt"]], "serial": "4\\n", ...}``.
Only the standard library: fcntl for the ioctls, mmap for guest memory and the vCPU's run
structure, ctypes for the memory's address.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
from typing import Any

KVMIO = 0xAE


def _io(nr: int) -> int:
    return (KVMIO << 8) | nr


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (KVMIO << 8) | nr


def _ior(nr: int, size: int) -> int:
    return (2 << 30) | (size << 16) | (KVMIO << 8) | nr


SREGS_SIZE = 312  # struct kvm_sregs on x86-64: 8 segments, 2 tables, 7 registers, the interrupt bitmap
REGS_SIZE = 144  # struct kvm_regs: 18 u64
KVM_GET_API_VERSION = _io(0x00)
KVM_CREATE_VM = _io(0x01)
KVM_GET_VCPU_MMAP_SIZE = _io(0x04)
KVM_CREATE_VCPU = _io(0x41)
KVM_SET_USER_MEMORY_REGION = _iow(0x46, 32)
KVM_RUN = _io(0x80)
KVM_SET_REGS = _iow(0x82, REGS_SIZE)
KVM_GET_SREGS = _ior(0x83, SREGS_SIZE)
KVM_SET_SREGS = _iow(0x84, SREGS_SIZE)
EXIT_IO, EXIT_HLT = 2, 5
GUEST_ADDRESS = 0x1000
SERIAL_PORT = 0x3F8
# mov dx, 0x3f8; add al, bl; add al, '0'; out dx, al; mov al, '\n'; out dx, al; hlt
GUEST_CODE = bytes.fromhex("baf80300d80430eeb00aeef4")


def run_vm(path: str = "/dev/kvm") -> dict[str, Any]:
    kvm = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        report: dict[str, Any] = {"api_version": fcntl.ioctl(kvm, KVM_GET_API_VERSION)}
        vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
        memory = mmap.mmap(-1, 0x1000, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, mmap.PROT_READ | mmap.PROT_WRITE)
        memory[: len(GUEST_CODE)] = GUEST_CODE
        address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        region = struct.pack("=IIQQQ", 0, 0, GUEST_ADDRESS, 0x1000, address)
        fcntl.ioctl(vm, KVM_SET_USER_MEMORY_REGION, region)
        vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
        size = fcntl.ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0)
        run = mmap.mmap(vcpu, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        sregs = bytearray(SREGS_SIZE)
        fcntl.ioctl(vcpu, KVM_GET_SREGS, sregs, True)
        struct.pack_into("=Q", sregs, 0, 0)  # cs.base 0 (cs.selector at 12 as well): code at 0x1000
        struct.pack_into("=H", sregs, 12, 0)
        fcntl.ioctl(vcpu, KVM_SET_SREGS, bytes(sregs))
        regs = [0] * 18
        regs[0], regs[1] = 2, 2  # rax, rbx: the guest adds them
        regs[16], regs[17] = GUEST_ADDRESS, 0x2  # rip; rflags bit 1 is always set
        fcntl.ioctl(vcpu, KVM_SET_REGS, struct.pack("=18Q", *regs))
        exits: list[list[Any]] = []
        for _ in range(8):
            fcntl.ioctl(vcpu, KVM_RUN, 0)
            (reason,) = struct.unpack_from("=I", run, 8)
            if reason == EXIT_IO:
                direction, width, port, count, offset = struct.unpack_from("=BBHIQ", run, 32)
                data = run[offset : offset + width * count].decode("latin-1")
                exits.append(["io", port, data] if direction == 1 else ["io-in", port])
            elif reason == EXIT_HLT:
                exits.append(["hlt"])
                break
            else:
                exits.append(["exit", reason])
                break
        report["exits"] = exits
        report["serial"] = "".join(e[2] for e in exits if e[0] == "io" and e[1] == SERIAL_PORT)
        return report
    finally:
        os.close(kvm)
