"""The functional probe of a KVM device, in the process that runs it (the probe's child;
``runner.py`` is the side the daemon calls).

Open the device, KVM_GET_API_VERSION, learn what it says of itself (DeviceFacts; the TSC
frequency from the guest's vCPU), run the guest program (guest.py) to its known exits,
close. The first step that fails gives the verdict, with its reason and a sentence; a
probe that passes says what it learned.

A SIGALRM deadline bounds the probe in its own process: KVM_RUN on a guest that never
exits returns EINTR at the signal, and the probe answers "timed out" without being killed.
What a signal cannot interrupt (a wait in the kernel) is bounded by the parent instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
import signal
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from ate_devplugin.kvm import abi, guest
from ate_devplugin.kvm.facts import DeviceFacts, read_device_facts, read_tsc_khz
from ate_devplugin.kvm.reasons import Reason, StepError, errno_text

_NO_DRIVER = (errno.ENODEV, errno.ENXIO)
_DENIED = (errno.EACCES, errno.EPERM)
# The guest program is x86-64 code: elsewhere the probe stops once the vCPU exists.
GUEST_MACHINES = frozenset({"x86_64"})


@dataclass(frozen=True)
class ProbeResult:
    device: str  # the path probed; the daemon puts the host's path in its place (kvmhealth/health.py)
    reason: Reason
    detail: str  # what the probe found, without the device's path: ``message`` says both
    duration_s: float
    rdev: str = ""  # "major:minor" of the node probed; "" when it could not be stat'ed
    api_version: int | None = None
    exits: tuple[str, ...] = ()  # the guest's exits, described (guest.Exit.describe)
    ran_guest: bool = False
    device_facts: DeviceFacts | None = None

    @property
    def passed(self) -> bool:
        return self.reason is Reason.PASSED

    @property
    def message(self) -> str:
        """What a log, /readyz or a report says: the device's path, then what was found."""
        return f"{self.device}: {self.detail}" if self.device else self.detail

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "passed": self.passed,
            "reason": str(self.reason),
            "detail": self.detail,
            "message": self.message,  # what a daemon before ``detail`` reads (its path cut off by prefix)
            "duration_s": round(self.duration_s, 6),
            "rdev": self.rdev,
            "api_version": self.api_version,
            "exits": list(self.exits),
            "ran_guest": self.ran_guest,
            "device_facts": self.device_facts.to_json() if self.device_facts else None,
        }


class Deadline(Exception):  # noqa: N818  (not an error of the code: the time is up)
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raises Deadline in this (main) thread after ``seconds``, once; disarmed on leaving,
    so nothing after the block is interrupted."""
    armed = True

    def expire(signum: int, frame: FrameType | None) -> None:
        if armed:
            raise Deadline

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(path: str, deadline_s: float, code: bytes = guest.CODE, machine: str | None = None) -> ProbeResult:
    """Probes the device at ``path``; never raises for what the device does."""
    start = time.monotonic()
    state: dict[str, Any] = {}
    try:
        with deadline(deadline_s):
            _probe(path, code, machine or platform.machine(), state)
    except StepError as failure:
        return _result(path, failure.reason, failure.message, start, state)
    except Deadline:
        where = f" (the guest's exits so far: {guest.describe(state['exits'])})" if "exits" in state else ""
        return _result(path, Reason.TIMED_OUT, f"no answer within {deadline_s:g}s{where}", start, state)
    ran = state.get("ran_guest", False)
    said = f"the guest made {guest.describe(guest.EXPECTED)}" if ran else "the guest program is x86-64 only: not run"
    return _result(path, Reason.PASSED, f"KVM API {abi.API_VERSION}, {said}", start, state)


def _result(path: str, reason: Reason, detail: str, start: float, state: Mapping[str, Any]) -> ProbeResult:
    exits: tuple[guest.Exit, ...] = state.get("exits", ())
    return ProbeResult(
        device=path,
        reason=reason,
        detail=detail,
        duration_s=time.monotonic() - start,
        rdev=state.get("rdev", ""),
        api_version=state.get("api_version"),
        exits=tuple(e.describe() for e in exits),
        ran_guest=bool(state.get("ran_guest")),
        device_facts=state.get("facts"),
    )


def _probe(path: str, code: bytes, machine: str, state: dict[str, Any]) -> None:
    """The steps; each records what it learned in ``state`` before the next can fail."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise StepError(Reason.MISSING, "no such device node") from exc
    except OSError as exc:
        reason = Reason.NO_PERMISSION if exc.errno in _DENIED else Reason.MISSING
        raise StepError(reason, f"cannot stat the device node: {errno_text(exc)}") from exc
    if not stat.S_ISCHR(st.st_mode):
        raise StepError(Reason.NOT_KVM, f"not a character device ({_kind(st.st_mode)})")
    state["rdev"] = rdev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _DENIED:
            raise StepError(Reason.NO_PERMISSION, f"opening character device {rdev}: {errno_text(exc)}") from exc
        if exc.errno in _NO_DRIVER:
            raise StepError(Reason.MISSING, f"no driver behind character device {rdev}: {errno_text(exc)}") from exc
        raise StepError(Reason.OPEN_FAILED, f"opening character device {rdev}: {errno_text(exc)}") from exc
    try:
        try:
            version = fcntl.ioctl(fd, abi.GET_API_VERSION)
        except OSError as exc:
            why = f"character device {rdev} does not answer KVM_GET_API_VERSION: {errno_text(exc)}"
            raise StepError(Reason.NOT_KVM, why) from exc
        state["api_version"] = version
        if version != abi.API_VERSION:
            raise StepError(Reason.API_VERSION, f"KVM API version {version}, not {abi.API_VERSION}")
        state["facts"] = facts = read_device_facts(fd, version)
        if machine in GUEST_MACHINES:
            state["exits"] = exits = _run(fd, code, state, facts)
            state["ran_guest"] = True
            if exits != guest.EXPECTED:
                raise StepError(
                    Reason.WRONG_EXIT,
                    f"the guest made {guest.describe(exits)}; expected {guest.describe(guest.EXPECTED)}",
                )
    finally:
        os.close(fd)


def _run(fd: int, code: bytes, state: dict[str, Any], facts: DeviceFacts) -> tuple[guest.Exit, ...]:
    exits: list[guest.Exit] = []
    state["exits"] = exits  # filled as the guest goes, for a deadline's message

    def tsc(vcpu: int) -> None:  # the guest's vCPU is the one the TSC frequency needs
        state["facts"] = replace(facts, tsc_khz=read_tsc_khz(vcpu))

    return guest.run(fd, code, on_exit=exits.append, on_vcpu=tsc)


_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a device")
