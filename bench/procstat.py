"""What the kernel says a process costs: resident memory, CPU time, context switches.

Everything is read from /proc. CPU time comes from ``/proc/<pid>/stat`` (utime + stime,
which counts every thread of the process, exited ones included); context switches are
only kept per thread (``/proc/<pid>/task/<tid>/status``), so they are summed over the
threads alive at each reading and kept per thread name too, to tell who wakes up.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_LIBC = ctypes.CDLL(None, use_errno=True)


def _status_fields(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size (VmRSS) of ``pid``."""
    kib = _status_fields(f"/proc/{pid}/status")["VmRSS"].split()[0]
    return int(kib) * 1024


def pss_bytes(pid: int) -> int | None:
    """Proportional set size (shared pages split between sharers), if the kernel has it."""
    try:
        fields = _status_fields(f"/proc/{pid}/smaps_rollup")
    except OSError:
        return None
    value = fields.get("Pss")
    return int(value.split()[0]) * 1024 if value else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    rest = text[text.rindex(")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])
    return (utime + stime) / _CLK_TCK


def exact_cpu_seconds(pid: int) -> float:
    """CPU time of the whole process ``pid`` from its CPU-time clock (nanoseconds, where
    /proc's ticks are 10 ms): for costs of a few milliseconds in a live process."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise ProcessLookupError(f"no CPU clock for process {pid}")
    return time.clock_gettime(clock.value)


def thread_switches(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread id: (thread name, voluntary + nonvoluntary context switches)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            fields = _status_fields(f"/proc/{pid}/task/{tid}/status")
        except OSError:
            continue  # the thread ended between listing and reading
        switches = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        out[int(tid)] = (fields.get("Name", "?"), switches)
    return out


@dataclass(frozen=True)
class Snapshot:
    pid: int
    cpu_s: float
    threads: dict[int, tuple[str, int]]

    @classmethod
    def take(cls, pid: int) -> Snapshot:
        return cls(pid=pid, cpu_s=cpu_seconds(pid), threads=thread_switches(pid))


@dataclass(frozen=True)
class IdleCost:
    """What a process did between two snapshots ``seconds`` apart."""

    seconds: float
    cpu_s: float
    switches: int
    by_thread: dict[str, int] = field(default_factory=dict)
    threads: int = 0

    @property
    def cpu_s_per_min(self) -> float:
        return self.cpu_s * 60.0 / self.seconds

    @property
    def switches_per_s(self) -> float:
        return self.switches / self.seconds

    @property
    def switches_per_min(self) -> float:
        return self.switches * 60.0 / self.seconds


def idle_cost(before: Snapshot, after: Snapshot, seconds: float) -> IdleCost:
    """The difference of two snapshots of one process (threads born in between count whole)."""
    total = 0
    by_name: dict[str, int] = defaultdict(int)
    for tid, (name, count) in after.threads.items():
        start = before.threads.get(tid, (name, 0))[1]
        delta = count - start
        total += delta
        by_name[name] += delta
    return IdleCost(
        seconds=seconds,
        cpu_s=after.cpu_s - before.cpu_s,
        switches=total,
        by_thread={k: v for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v},
        threads=len(after.threads),
    )


def total_rss_bytes(pids: Iterable[int]) -> int:
    return sum(rss_bytes(p) for p in pids)
