"""Why a probe failed, as a stable code and a sentence.

The codes are API: they become the value of a DRA device taint (a label value: at most
63 characters of letters, digits, ``-``, ``_`` and ``.``), a metric label and the first
word of ``/readyz``'s text, so a code is never renamed once released.
"""

from __future__ import annotations

import errno
from enum import StrEnum


class Reason(StrEnum):
    PASSED = "passed"
    MISSING = "missing"  # no node at the path, or no driver behind it (ENODEV/ENXIO: the module is not loaded)
    NO_PERMISSION = "no-permission"  # EACCES/EPERM: file mode, or the runtime's device filter
    NOT_KVM = "not-a-kvm-device"  # not a character device, or it does not answer KVM_GET_API_VERSION
    OPEN_FAILED = "open-failed"  # open failed for another reason (errno in the message)
    API_VERSION = "api-version-mismatch"  # KVM_GET_API_VERSION is not 12
    CREATE_VM = "create-vm-failed"
    MEMORY_SLOT = "memory-slot-failed"
    VCPU = "vcpu-failed"  # KVM_CREATE_VCPU, its run structure or its registers
    RUN = "run-failed"  # KVM_RUN failed (errno), or the guest shut down (triple fault)
    ENTRY_FAILED = "entry-failed"  # KVM_EXIT_FAIL_ENTRY: the CPU refused to enter the guest
    INTERNAL_ERROR = "internal-error"  # KVM_EXIT_INTERNAL_ERROR, e.g. an emulation failure
    WRONG_EXIT = "wrong-exit"  # the guest ran, but not to the exits it was written to reach
    TIMED_OUT = "timed-out"  # no answer within the deadline: the child was killed or abandoned
    PROBER_FAILED = "prober-failed"  # the probe's child process died or answered nonsense


class StepError(Exception):
    """A probe step that failed: its reason and a readable message."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def errno_text(exc: OSError) -> str:
    """``ENOTTY (Inappropriate ioctl for device)`` for an OSError with an errno."""
    if exc.errno is None:
        return str(exc)
    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}")
    return f"{name} ({exc.strerror or 'no message'})"


# Reasons that say the probe could not judge the device, not that the device failed: the
# prober (or the daemon probing itself) may not open it, or its probe process failed. The
# device is then judged by existence, and the state says so (docs/kvm-health.md, "States").
CANNOT_PROBE = frozenset({Reason.NO_PERMISSION, Reason.PROBER_FAILED})
