"""Probing from asyncio: ``await ProbeRunner().probe("/dev/kvm", timeout)``.

A probe can hang in the kernel, so it never runs in the daemon's process: a child process
(worker.py) runs it, and the caller waits for its answer on a pipe, on the event loop,
within ``timeout``. The pipe speaks kvm/wire.py (a check down, its result back), the
prober's socket's encoding and line bound. The child bounds itself first (a SIGALRM at most ``CHILD_SHARE`` of
what is left, which interrupts a KVM_RUN that does not return) and answers "timed out" on
its own; if no answer comes by ``timeout`` the child is killed, and if it has not gone
``kill_wait_s`` after SIGKILL (a process stuck in the kernel cannot die until the kernel
lets it) it is abandoned: the result is "timed out", the next probe starts a new child,
and nothing ever waits for the abandoned one again, not even :meth:`ProbeRunner.close`.

By default one worker serves every probe (``reuse``): a probe then costs its ioctls, not
an interpreter's start (bench/kvm_probe.py measures both). Probes are serialised: a
second caller waits for the first, and its own timeout starts when its turn comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from ate_devplugin.kvm import wire
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

log = logging.getLogger(__name__)

WORKER = (sys.executable, "-m", "ate_devplugin.kvm.worker")
CHILD_SHARE = 0.8  # of the time left when the request is sent: the child's own deadline
KILL_WAIT_S = 0.5  # after SIGKILL, how long the child has to go before it is abandoned
CLOSE_WAIT_S = 0.2  # at close, how long a worker has to end after its stdin is closed

Kill = Callable[[asyncio.subprocess.Process], None]


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.kill()


class Runner(Protocol):
    """What probes a device by its path: a :class:`ProbeRunner` (a test's fake elsewhere)."""

    async def probe(self, device: str, timeout: float) -> ProbeResult: ...

    async def close(self) -> None: ...


class ProbeRunner:
    def __init__(
        self,
        command: Sequence[str] = WORKER,
        reuse: bool = True,
        kill_wait_s: float = KILL_WAIT_S,
        kill: Kill = _kill,
    ) -> None:
        self.command = tuple(command)
        self.reuse = reuse
        self.kill_wait_s = kill_wait_s
        self._kill = kill
        self._worker: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()
        self.abandoned: list[asyncio.subprocess.Process] = []  # killed, but not gone in time
        self._dropped: list[asyncio.subprocess.Process] = []

    async def probe(self, device: str, timeout: float) -> ProbeResult:
        """The verdict on ``device`` within about ``timeout`` seconds (plus ``kill_wait_s``
        when the child has to be killed); never raises but for cancellation."""
        async with self._turn:
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                async with asyncio.timeout(timeout):
                    worker = await self._ready()
                    left = timeout - (loop.time() - start)
                    request = wire.Check(device, round(max(left * CHILD_SHARE, 0.001), 3))
                    assert worker.stdin is not None
                    assert worker.stdout is not None
                    worker.stdin.write(wire.encode(request))
                    await worker.stdin.drain()
                    line = await worker.stdout.readline()
            except TimeoutError:
                gone = await self._discard()
                fate = "killed" if gone else f"killed, and still not gone after {self.kill_wait_s:g}s: abandoned"
                return _failed(device, Reason.TIMED_OUT, f"no answer within {timeout:g}s: the probe process was {fate}",
                               loop.time() - start)  # fmt: skip
            except (OSError, ValueError) as exc:  # the worker could not start, or its pipe broke
                await self._discard()
                return _failed(device, Reason.PROBER_FAILED, f"the probe process failed: {exc}", loop.time() - start)
            except asyncio.CancelledError:
                # Its answer would be taken for the next probe's: the worker goes, unwaited.
                self._drop()
                raise
            result = await self._read(device, line, loop.time() - start)
            if not self.reuse:
                await self._end_worker()
            return result

    async def _ready(self) -> asyncio.subprocess.Process:
        if self._worker is None or self._worker.returncode is not None:
            self._worker = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=wire.MAX_LINE
            )
        return self._worker

    async def _read(self, device: str, line: bytes, elapsed: float) -> ProbeResult:
        if not line:
            code = await self._exit_code()
            return _failed(device, Reason.PROBER_FAILED, f"the probe process ended without an answer ({code})", elapsed)
        try:
            answer = wire.decode(line)
            if not isinstance(answer, wire.Checked):
                raise wire.WireError(f"a {type(answer).__name__.lower()}, not an answer")
            if answer.result.device != device:
                raise wire.WireError(f"an answer about {answer.result.device!r}")
        except wire.WireError as exc:
            await self._discard()
            return _failed(device, Reason.PROBER_FAILED, f"the probe process answered nonsense: {exc}", elapsed)
        return answer.result

    async def _exit_code(self) -> str:
        worker, self._worker = self._worker, None
        if worker is None:  # pragma: no cover  (only called with a worker)
            return "no process"
        try:
            code = await asyncio.wait_for(worker.wait(), self.kill_wait_s)
        except TimeoutError:
            self._abandon(worker)
            return "it did not exit"
        return f"exit code {code}"

    async def _discard(self) -> bool:
        """Kills the worker; whether it went within ``kill_wait_s`` (else it is abandoned)."""
        worker, self._worker = self._worker, None
        if worker is None or worker.returncode is not None:
            return True
        self._kill(worker)
        try:
            await asyncio.wait_for(worker.wait(), self.kill_wait_s)
        except TimeoutError:
            self._abandon(worker)
            return False
        return True

    def _drop(self) -> None:
        """Kills the worker and forgets it at once (a cancelled probe cannot wait)."""
        worker, self._worker = self._worker, None
        if worker is not None and worker.returncode is None:
            self._kill(worker)
            self._dropped.append(worker)  # referenced until it is reaped

    def _abandon(self, worker: asyncio.subprocess.Process) -> None:
        log.warning("a KVM probe process did not exit after SIGKILL: abandoned", extra={"pid": worker.pid})
        self.abandoned.append(worker)

    async def _end_worker(self) -> None:
        """Ends the worker: stdin closed (it ends at EOF), killed if it does not."""
        worker = self._worker
        if worker is None:
            return
        if worker.stdin is not None:
            worker.stdin.close()
        try:
            await asyncio.wait_for(worker.wait(), CLOSE_WAIT_S)
            self._worker = None
        except TimeoutError:
            await self._discard()

    async def close(self) -> None:
        """Ends the worker within CLOSE_WAIT_S + kill_wait_s, then gives those killed by a
        cancelled probe kill_wait_s to be reaped; waits for no abandoned one."""
        await self._end_worker()
        for worker in (*self.abandoned, *self._dropped):
            if worker.returncode is None:
                _kill(worker)  # once more: if the kernel ever lets it go, it goes
        # Reaped while the loop runs: a transport left to the collector calls into a closed loop.
        reaped = [asyncio.ensure_future(w.wait()) for w in self._dropped if w.returncode is None]
        if reaped:
            _, late = await asyncio.wait(reaped, timeout=self.kill_wait_s)
            for wait in late:
                wait.cancel()


async def probe_once(device: str, timeout: float) -> ProbeResult:
    """One probe in a worker of its own, for a command (verify, cpu-profile, restorable)."""
    runner = ProbeRunner(reuse=False)
    try:
        return await runner.probe(device, timeout)
    finally:
        await runner.close()


def _failed(device: str, reason: Reason, detail: str, elapsed: float) -> ProbeResult:
    return ProbeResult(device=device, reason=reason, detail=detail, duration_s=elapsed)
