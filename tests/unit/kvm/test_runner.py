"""The probe from asyncio: real child processes (the product's worker, and children that
hang, die or talk nonsense), the deadline, kill and abandon, and a loop that never waits.
What any user can probe (/dev/null, a missing path) stands in for the device here; the
KVM device itself is probed in tests/kvm."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ate_devplugin.kvm import wire, worker
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.runner import ProbeRunner

PY = sys.executable


def child(script: str) -> list[str]:
    return [PY, "-c", script]


HANGS = child("import sys, time; sys.stdin.readline(); time.sleep(600)")


def counted(log: Path, script: str = "from ate_devplugin.kvm import worker; worker.main()") -> list[str]:
    """A child that writes a line to ``log`` as it starts, then runs ``script`` (the product's worker)."""
    return child(f"open({str(log)!r}, 'a').write('started\\n'); {script}")


def starts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


DIES = child("import sys; sys.stdin.readline(); sys.exit(3)")
NONSENSE = child("import sys; sys.stdin.readline(); print('not json', flush=True); sys.stdin.readline()")
WRONG_DEVICE = child(
    "import sys; from ate_devplugin.kvm import wire; from ate_devplugin.kvm.probe import ProbeResult; "
    "from ate_devplugin.kvm.reasons import Reason; sys.stdin.readline(); "
    "sys.stdout.buffer.write(wire.encode(wire.Checked(ProbeResult('/dev/other', Reason.PASSED, '', 0.0)))); "
    "sys.stdout.flush()"
)


class LoopLag:
    """The longest the event loop went without running a 10 ms ticker."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, loop.time() - before - 0.01)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.fixture
async def prober(tmp_path: Path) -> AsyncIterator[ProbeRunner]:
    p = ProbeRunner(counted(tmp_path / "starts"))
    yield p
    await p.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped since the kill
        return False


async def test_one_worker_answers_every_probe(prober: ProbeRunner, tmp_path: Path) -> None:
    results = [await prober.probe(d, 10) for d in ("/dev/null", str(tmp_path / "kvm"), "/dev/null")]
    assert [r.reason for r in results] == [Reason.NOT_KVM, Reason.MISSING, Reason.NOT_KVM]
    assert results[0].rdev == "1:3"
    assert starts(tmp_path / "starts") == 1


async def test_a_worker_per_probe_when_not_reused(tmp_path: Path) -> None:
    p = ProbeRunner(counted(tmp_path / "starts"), reuse=False)
    try:
        for _ in range(3):
            assert (await p.probe("/dev/null", 10)).reason is Reason.NOT_KVM
    finally:
        await p.close()
    assert starts(tmp_path / "starts") == 3


async def test_a_child_that_hangs_is_killed_at_the_deadline_and_the_loop_never_waits(tmp_path: Path) -> None:
    p = ProbeRunner(counted(tmp_path / "starts", "import sys, time; sys.stdin.readline(); time.sleep(600)"))
    async with LoopLag() as lag:
        start = time.monotonic()
        probing = asyncio.create_task(p.probe("/dev/kvm", 0.5))
        while p._worker is None:
            await asyncio.sleep(0.01)
        pid = p._worker.pid
        result = await probing
        took = time.monotonic() - start
        again = await p.probe("/dev/kvm", 0.3)  # a new worker: the killed one is gone
    await p.close()
    assert (result.reason, result.passed) == (Reason.TIMED_OUT, False)
    assert result.message == "/dev/kvm: no answer within 0.5s: the probe process was killed"
    assert 0.5 <= took < 60  # a hang bound, far under the child's 600 s sleep
    assert not alive(pid)
    assert again.reason is Reason.TIMED_OUT
    assert (starts(tmp_path / "starts"), p.abandoned) == (2, [])
    assert lag.worst < 0.25  # the ticker ran all along (the bound is generous: 2 shared cores)


async def test_a_child_that_outlives_its_kill_is_abandoned_and_never_waited_for() -> None:
    killed: list[int] = []
    p = ProbeRunner(HANGS, kill_wait_s=0.2, kill=lambda proc: killed.append(proc.pid))  # a kill that does not take
    result = await p.probe("/dev/kvm", 0.3)
    assert result.reason is Reason.TIMED_OUT
    assert result.message.endswith("the probe process was killed, and still not gone after 0.2s: abandoned")
    assert [w.pid for w in p.abandoned] == killed
    stuck = p.abandoned[0].pid
    start = time.monotonic()
    await p.close()  # kills it once more, but waits for nothing
    assert time.monotonic() - start < 60  # a hang bound: the stuck child sleeps 600 s
    for _ in range(100):
        if not alive(stuck):
            break
        await asyncio.sleep(0.02)
    assert not alive(stuck)
    # Reaped while this loop runs: its transport would otherwise call into a closed loop.
    await asyncio.wait_for(p.abandoned[0].wait(), 5)


async def test_a_child_that_dies_or_talks_nonsense_is_a_prober_failure() -> None:
    for command, text in (
        (DIES, "/dev/kvm: the probe process ended without an answer (exit code 3)"),
        (
            NONSENSE,
            "/dev/kvm: the probe process answered nonsense: not JSON: Expecting value: line 1 column 1 (char 0)",
        ),
        (WRONG_DEVICE, "/dev/kvm: the probe process answered nonsense: an answer about '/dev/other'"),
        ([str(Path("/nonexistent/python"))], "/dev/kvm: the probe process failed: [Errno 2] No such file or directory"),
    ):
        p = ProbeRunner(command)
        result = await p.probe("/dev/kvm", 5)
        await p.close()
        assert (result.reason, result.message.split(": '/nonexistent")[0]) == (Reason.PROBER_FAILED, text)


async def test_a_cancelled_probe_takes_its_worker_with_it() -> None:
    p = ProbeRunner(HANGS)
    task = asyncio.create_task(p.probe("/dev/kvm", 30))
    while p._worker is None:
        await asyncio.sleep(0.01)
    pid = p._worker.pid
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert p._worker is None  # its late answer cannot be taken for the next probe's
    await p.close()
    for _ in range(100):
        if not alive(pid):
            break
        await asyncio.sleep(0.02)
    assert not alive(pid)
    assert p._dropped[0].returncode is not None  # reaped by close(), while this loop runs


async def test_probes_take_turns(tmp_path: Path) -> None:
    p = ProbeRunner(counted(tmp_path / "starts"))
    try:
        results = await asyncio.gather(*(p.probe("/dev/null", 10) for _ in range(4)))
    finally:
        await p.close()
    assert {r.reason for r in results} == {Reason.NOT_KVM}
    assert starts(tmp_path / "starts") == 1


async def test_close_ends_the_worker_through_its_stdin(prober: ProbeRunner) -> None:
    await prober.probe("/dev/null", 10)
    worker_process = prober._worker
    assert worker_process is not None
    await prober.close()
    assert worker_process.returncode == 0  # it read EOF and left, not killed


def test_the_worker_answers_each_line_and_a_bad_request_with_a_prober_failure() -> None:
    """Both ends of the pipe speak kvm/wire.py: a request it cannot read is told in wire's words."""
    check = wire.encode(wire.Check("/dev/null", 1.0))
    requests = io.BytesIO(check + b"not json\n" + b'{"v":1,"check":{"device":"/dev/null"}}\n')
    out = io.BytesIO()
    worker.serve(requests, out)
    answers = [wire.decode(line) for line in out.getvalue().splitlines(keepends=True)]
    assert all(isinstance(a, wire.Checked) for a in answers)
    results = [a.result for a in answers if isinstance(a, wire.Checked)]
    assert [r.reason for r in results] == ["not-a-kvm-device", "prober-failed", "prober-failed"]
    assert results[1].message.startswith("the probe could not read its request: not JSON: Expecting value")
    assert results[2].message == (
        "the probe could not read its request: check.deadline_s: None is not a number of seconds in (0, 86400]"
    )


def test_the_worker_ignores_the_terminals_interrupt() -> None:
    previous = signal.getsignal(signal.SIGINT)
    try:
        sys.stdin, saved = io.TextIOWrapper(io.BytesIO()), sys.stdin
        try:
            worker.main()
        finally:
            sys.stdin = saved
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
