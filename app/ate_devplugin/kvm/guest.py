"""The guest program: a VM with one page of memory and one vCPU in real mode, running
twelve bytes of code to known exits. The probe runs it, and so does ``verify``.

The guest adds the two numbers it finds in its registers (2 and 2), writes the digit to
the serial port 0x3f8 (a port-I/O exit), writes a newline (another), and halts (an HLT
exit). Those three exits, in that order, mean the device created a VM, mapped its memory,
entered the guest and came back with what the guest did: KVM works, not only answers.
The same guest runs in the kubelet bench's consumer (tests/harness/microvm.py, which
carries its own copy: it runs where the product package is not installed).

Each step that fails raises :class:`StepError` with the reason of that step. Everything is
closed before returning, in reverse order of creation, so a long-lived probe process
keeps no VM between probes.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ate_devplugin.kvm import abi
from ate_devplugin.kvm.reasons import Reason, StepError, errno_text

GUEST_ADDRESS = 0x1000
MEMORY_SIZE = 0x1000
SERIAL_PORT = 0x3F8
# mov dx, 0x3f8; add al, bl; add al, '0'; out dx, al; mov al, '\n'; out dx, al; hlt
CODE = bytes.fromhex("baf80300d80430eeb00aeef4")
INPUTS = (2, 2)  # rax, rbx: the guest adds them
MAX_EXITS = 8  # the program needs three; a guest that goes on is a wrong one


@dataclass(frozen=True)
class Exit:
    """One exit to the host: ``kind`` is ``out``, ``in``, ``hlt`` or a KVM_EXIT_* name."""

    kind: str
    port: int = 0
    data: bytes = b""

    def describe(self) -> str:
        if self.kind == "out":
            return f"out 0x{self.port:x} {self.data.decode('latin-1')!r}"
        if self.kind == "in":
            return f"in 0x{self.port:x}"
        return self.kind


EXPECTED = (Exit("out", SERIAL_PORT, b"4"), Exit("out", SERIAL_PORT, b"\n"), Exit("hlt"))


def describe(exits: Sequence[Exit]) -> str:
    return ", ".join(e.describe() for e in exits) or "none"


def _ioctl(fd: int, request: int, arg: int | bytes | bytearray, reason: Reason, what: str) -> int:
    """An ioctl whose answer is its return value (a bytearray argument is filled in place)."""
    try:
        if isinstance(arg, bytearray):
            return int(fcntl.ioctl(fd, request, arg, True))
        if isinstance(arg, bytes):
            fcntl.ioctl(fd, request, arg)  # what the kernel read; a copy of it comes back
            return 0
        return fcntl.ioctl(fd, request, arg)
    except OSError as exc:
        raise StepError(reason, f"{what} failed: {errno_text(exc)}") from exc


def run(
    kvm: int,
    code: bytes = CODE,
    inputs: tuple[int, int] = INPUTS,
    on_exit: Callable[[Exit], None] = lambda _: None,
    on_vcpu: Callable[[int], None] = lambda _: None,
) -> tuple[Exit, ...]:
    """Runs ``code`` in a new VM of the open KVM device ``kvm``; the exits it made (each
    also given to ``on_exit`` as it comes). ``on_vcpu`` is given the new vCPU's fd before
    it runs (the probe reads its TSC frequency).

    Stops at HLT, at an exit the program does not expect, or after MAX_EXITS."""
    with contextlib.ExitStack() as stack:
        vm = _ioctl(kvm, abi.CREATE_VM, 0, Reason.CREATE_VM, "KVM_CREATE_VM")
        stack.callback(os.close, vm)
        memory = mmap.mmap(-1, MEMORY_SIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, mmap.PROT_READ | mmap.PROT_WRITE)
        stack.callback(memory.close)
        memory[: len(code)] = code
        anchor = ctypes.c_char.from_buffer(memory)
        address = ctypes.addressof(anchor)
        del anchor  # an exported buffer would keep the mapping from being closed
        region = struct.pack("=IIQQQ", 0, 0, GUEST_ADDRESS, MEMORY_SIZE, address)
        _ioctl(vm, abi.SET_USER_MEMORY_REGION, region, Reason.MEMORY_SLOT, "KVM_SET_USER_MEMORY_REGION")
        vcpu = _ioctl(vm, abi.CREATE_VCPU, 0, Reason.VCPU, "KVM_CREATE_VCPU")
        stack.callback(os.close, vcpu)
        on_vcpu(vcpu)
        size = _ioctl(kvm, abi.GET_VCPU_MMAP_SIZE, 0, Reason.VCPU, "KVM_GET_VCPU_MMAP_SIZE")
        try:
            shared = mmap.mmap(vcpu, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise StepError(Reason.VCPU, f"mapping the vCPU's run structure failed: {errno_text(exc)}") from exc
        stack.callback(shared.close)
        _real_mode_at(vcpu, GUEST_ADDRESS, inputs)
        return _run_to_halt(vcpu, shared, on_exit)
    raise AssertionError("unreachable")  # pragma: no cover  (mypy: ExitStack may swallow)


def _real_mode_at(vcpu: int, address: int, inputs: tuple[int, int]) -> None:
    """The vCPU in real mode with its code segment at 0, about to run ``address``."""
    sregs = bytearray(abi.SREGS_SIZE)
    _ioctl(vcpu, abi.GET_SREGS, sregs, Reason.VCPU, "KVM_GET_SREGS")
    struct.pack_into("=Q", sregs, 0, 0)  # cs.base
    struct.pack_into("=H", sregs, 12, 0)  # cs.selector
    _ioctl(vcpu, abi.SET_SREGS, bytes(sregs), Reason.VCPU, "KVM_SET_SREGS")
    regs = [0] * 18
    regs[0], regs[1] = inputs  # rax, rbx
    regs[16], regs[17] = address, 0x2  # rip; bit 1 of rflags is always set
    _ioctl(vcpu, abi.SET_REGS, struct.pack("=18Q", *regs), Reason.VCPU, "KVM_SET_REGS")


def _run_to_halt(vcpu: int, shared: mmap.mmap, on_exit: Callable[[Exit], None]) -> tuple[Exit, ...]:
    exits: list[Exit] = []

    def seen(one: Exit) -> None:
        exits.append(one)
        on_exit(one)

    for _ in range(MAX_EXITS):
        try:
            fcntl.ioctl(vcpu, abi.RUN, 0)
        except OSError as exc:
            raise StepError(Reason.RUN, f"KVM_RUN failed: {errno_text(exc)} after {describe(exits)}") from exc
        (reason,) = struct.unpack_from("=I", shared, abi.RUN_EXIT_REASON)
        if reason == abi.EXIT_IO:
            direction, width, port, count, offset = struct.unpack_from(abi.IO_FORMAT, shared, abi.RUN_EXIT_DATA)
            if direction == abi.IO_OUT:
                seen(Exit("out", port, bytes(shared[offset : offset + width * count])))
            else:
                seen(Exit("in", port))
            continue
        if reason == abi.EXIT_HLT:
            seen(Exit("hlt"))
            return tuple(exits)
        _fail_on_exit(reason, shared, exits)
    return tuple(exits)


def _fail_on_exit(reason: int, shared: mmap.mmap | bytearray, exits: list[Exit]) -> None:
    """An exit the program never makes: a failure with what KVM said about it."""
    name = abi.exit_name(reason)
    before = f"after {describe(exits)}"
    if reason == abi.EXIT_FAIL_ENTRY:
        (hardware_reason,) = struct.unpack_from("=Q", shared, abi.RUN_EXIT_DATA)
        raise StepError(
            Reason.ENTRY_FAILED, f"{name}: the CPU refused to enter the guest, hardware error 0x{hardware_reason:x}"
        )
    if reason == abi.EXIT_INTERNAL_ERROR:
        (suberror,) = struct.unpack_from("=I", shared, abi.RUN_EXIT_DATA)
        what = abi.INTERNAL_ERROR_NAMES.get(suberror, "unknown")
        raise StepError(Reason.INTERNAL_ERROR, f"{name}: suberror {suberror} ({what}) {before}")
    if reason == abi.EXIT_SHUTDOWN:
        raise StepError(Reason.RUN, f"{name}: the guest shut down (triple fault) {before}")
    if reason == abi.EXIT_UNKNOWN:
        (hardware_reason,) = struct.unpack_from("=Q", shared, abi.RUN_EXIT_DATA)
        raise StepError(Reason.RUN, f"{name}: hardware exit reason 0x{hardware_reason:x} {before}")
    raise StepError(Reason.WRONG_EXIT, f"the guest stopped at {name} {before}; expected {describe(EXPECTED)}")
