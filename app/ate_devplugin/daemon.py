"""The supervisor: one inbox, the event router, the stall watchdog, reload and a bounded stop.

Filesystem events, SIGHUP, the components' notices, stop requests and task deaths arrive in
one inbox (``put``). Per batch the watching components hear the filesystem events, every
component the new resources if the config file changed, the notices told meanwhile, then
one view (view.py) of the devices discovered again and the last KVM state told; notices
alone make a view only when the KVM state changed. A batch not handled in time is a stall
(/healthz fails); a guarded task that dies ends the daemon (exit 1: the DaemonSet starts it
afresh); the stop is bounded, naming what is stuck.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ate_devplugin.components import Component, Liveness, Notice, Notices, Readiness, Resources, Telling, Watching
from ate_devplugin.host.devices import Discover, discover, watch_dirs
from ate_devplugin.host.watcher import FsEvent, Watcher, Watches, removed_dirs, touches
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.reload import ConfigReader
from ate_devplugin.settings import DaemonSettings
from ate_devplugin.tasks import Guard, TaskDiedError, Watchdog, cancel, stop_all
from ate_devplugin.view import Views

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reload:
    """SIGHUP: read the config file again."""


@dataclass(frozen=True)
class Stop:
    why: str  # e.g. the signal's name


@dataclass(frozen=True)
class TaskDied:
    name: str
    error: BaseException


class Daemon:
    def __init__(
        self,
        settings: DaemonSettings,
        resources: Resources,
        components: Sequence[Component],
        metrics: Metrics,
        reader: ConfigReader | None = None,  # None: no config file, the default resources
        discover: Discover = discover,
    ) -> None:
        self.settings = settings
        self.resources = resources
        self.components = list(components)
        # The capabilities each asked for (components.py).
        self._ready = [c for c in components if isinstance(c, Readiness)]
        self._alive = [c for c in components if isinstance(c, Liveness)]
        self._watching = [c for c in components if isinstance(c, Watching)]
        self.metrics = metrics
        self.reader = reader
        self.guard = Guard(
            lambda name, error: self.put(TaskDied(name, error)), lambda kind: metrics.task_failures.labels(kind).inc()
        )
        self._inbox: list[FsEvent | Reload] = []
        self._notices = Notices()
        for telling in (c for c in components if isinstance(c, Telling)):
            telling.tell_to(self.put)  # notices are events of the inbox
        self._arrived = asyncio.Event()
        self._stop: Stop | TaskDied | None = None
        self._stopping = asyncio.Event()
        self._watcher = Watcher(asyncio.get_running_loop(), self.put)
        self._watchdog = Watchdog("event_handling", settings.event_deadline_s, self._stalled)
        self.views = Views(discover, settings.device_root)  # hears the KVM state; has the last view

    def readiness(self) -> tuple[bool, str]:
        """Ready when every component is; the first that is not says why."""
        answers = [c.readiness() for c in self._ready]
        waiting = next((why for ready, why in answers if not ready), None)
        return (False, waiting) if waiting is not None else (True, "; ".join(w for _, w in answers if w) or "ok")

    def liveness(self) -> tuple[bool, str]:
        """Alive while events are handled in time and nothing of any component is stuck."""
        stuck = [why for alive, why in (c.liveness() for c in (self._watchdog, *self._alive)) if not alive]
        return (False, "; ".join(stuck)) if stuck else (True, "ok")

    def put(self, event: FsEvent | Reload | Stop | TaskDied | Notice) -> None:
        if isinstance(event, Stop | TaskDied):
            self._stop = self._stop or event
            return self._stopping.set()
        if isinstance(event, FsEvent | Reload):
            self._inbox.append(event)
        else:
            self._notices.add(event)
        self._arrived.set()

    def request_stop(self, why: str) -> None:
        self.put(Stop(why))

    def request_reload(self) -> None:
        self.put(Reload())

    async def run(self) -> None:
        """Runs until a stop is requested; raises TaskDiedError when a guarded task died."""
        self._watcher.start()
        router: asyncio.Task[None] | None = None
        try:
            for component in self.components:
                await component.start(self.resources, self.guard)
            self._refresh()
            names = [r.name for r in self.resources]
            log.info("started", extra={"resources": names, "device_root": self.settings.device_root})
            router = self.guard.spawn("event_router", self._route_events(), "event router")
            await self._stopping.wait()
        finally:
            await self._shutdown(router)
        if isinstance(self._stop, TaskDied):
            # Something nobody does any more: exit, so the DaemonSet starts us afresh.
            raise TaskDiedError(f"{self._stop.name} died; see the error above") from self._stop.error

    async def _shutdown(self, router: asyncio.Task[None] | None) -> None:
        """Everything down within ``shutdown_deadline_s``; names what is stuck."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_deadline_s
        if self._stop is not None:
            why = self._stop.why if isinstance(self._stop, Stop) else f"{self._stop.name} died"
            log.info("stopping", extra={"why": why})
        stuck = [] if await cancel(router, self.settings.shutdown_deadline_s) else ["event router"]
        remaining = max(0.0, deadline - loop.time())
        # Each gets a little less than what is left, to return its own answer in time.
        stuck += await stop_all({c.name: c.stop(max(0.0, remaining - 0.2)) for c in self.components}, remaining)
        if stuck:
            log.error("shutdown deadline passed; still running: %s", ", ".join(stuck))
        self._watcher.stop()

    async def _route_events(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            batch, self._inbox = self._inbox, []
            with self._watchdog.watching(batch):
                await self._handle(batch)

    def _stalled(self, batch: object) -> None:
        self.metrics.lifecycle_stalls.labels("event_handling").inc()
        why = {"reason": "event_handling", "stuck": repr(batch)[:500]}
        log.error("lifecycle stalled: %s", self._watchdog.stuck, extra=why)

    async def _handle(self, batch: list[FsEvent | Reload]) -> None:
        if not batch:
            return self._render(discover=False)  # notices alone: no device can have changed
        fs_events = [e for e in batch if isinstance(e, FsEvent)]
        for path in removed_dirs(fs_events):
            self._watcher.forget(path)
        if fs_events:
            for watching in self._watching:
                watching.on_fs_events(fs_events)
        asked = any(isinstance(e, Reload) for e in batch)
        if self.reader and (asked or touches(fs_events, str(self.reader.path.parent))):
            await self._reload(self.reader)
        self._refresh()

    async def _reload(self, reader: ConfigReader) -> None:
        if (resources := await reader.read(self.resources)) is not None:
            for component in self.components:
                await component.on_resources(resources)
            self.resources = resources
            reader.reloaded(resources)

    def _refresh(self) -> None:
        """Arms watches first, then reads the state, so nothing falls between the two; and again
        if the view changed what a component watches (a socket it will make)."""
        watches = self._watches()
        self._watcher.watch(watches)
        self._render(discover=True)
        after = self._watches()
        if after != watches:
            self._watcher.watch(after)

    def _render(self, discover: bool) -> None:
        """The notices told meanwhile (the KVM state to the views), then one view rendered once by
        every component: of the devices discovered anew, or of the last with a new KVM state."""
        self._notices.deliver([self.views, *self.components])
        if discover or self.views.kvm_told:
            view = self.views.discover(self.resources) if discover else self.views.again()
            for component in self.components:
                component.on_view(view)

    def _watches(self) -> Watches:
        watches = Watches(dirs=frozenset(d for r in self.resources for d in watch_dirs(r, self.settings.device_root)))
        if self.reader is not None:
            watches |= Watches(dirs=frozenset({str(self.reader.path.parent)}))
        for watching in self._watching:
            watches |= watching.watches()
        return watches
