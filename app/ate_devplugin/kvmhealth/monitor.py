"""When each KVM resource is probed: one guarded task per resource that probes when woken
(a new node, a prober that came) and, while ``periodic`` says so, every period, jittered so
that nodes do not probe in step. What a probe does and what its verdict means is
kvmhealth/health.py's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from ate_devplugin.tasks import Guard, cancel

JITTER = 0.1  # each period is drawn from period * (1 +- JITTER)


class Schedule:
    def __init__(
        self,
        period: float,
        probe: Callable[[str], Awaitable[None]],
        periodic: Callable[[str], bool],
        rng: Callable[[], float] = random.random,
    ) -> None:
        """``probe(name)`` probes a resource; ``periodic(name)``: whether it is due again
        after a period (else only when woken). A ``period`` of 0 probes only when woken."""
        self.period = period
        self._probe = probe
        self._periodic = periodic
        self._rng = rng
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def add(self, name: str, guard: Guard) -> None:
        wake = self._wake[name] = asyncio.Event()
        self._tasks[name] = guard.spawn("kvm_probe", self._run(name, wake), f"kvm probe {name}")

    async def remove(self, name: str, deadline_s: float) -> bool:
        """Whether its task ended within ``deadline_s`` (a probe in flight is cancelled)."""
        del self._wake[name]
        return await cancel(self._tasks.pop(name), deadline_s)

    async def stop(self, deadline_s: float) -> list[str]:
        """Every task cancelled at once; the names of those that did not end in time."""
        names = list(self._tasks)
        ended = await asyncio.gather(*(self.remove(name, deadline_s) for name in names))
        return [name for name, done in zip(names, ended, strict=True) if not done]

    def wake(self, name: str) -> None:
        self._wake[name].set()

    def wake_all(self) -> None:
        for wake in self._wake.values():
            wake.set()

    async def _run(self, name: str, wake: asyncio.Event) -> None:
        while True:
            await self._sleep(name, wake)
            wake.clear()
            await self._probe(name)

    async def _sleep(self, name: str, wake: asyncio.Event) -> None:
        if self.period <= 0 or not self._periodic(name):
            await wake.wait()
            return
        jittered = self.period * (1 + JITTER * (2 * self._rng() - 1))
        try:
            async with asyncio.timeout(jittered):
                await wake.wait()
        except TimeoutError:
            pass
