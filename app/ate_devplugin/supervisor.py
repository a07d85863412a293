"""The lifecycle: serve, register, follow the kubelet and the devices, repeat.

One ResourceAgent per configured resource keeps that resource served and registered;
the Daemon turns filesystem events into what the agents must do. Everything runs on one
event loop; nothing polls: agents sleep until woken or until a backoff delay ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from opentelemetry import context
from opentelemetry.trace import SpanKind

from ate_devplugin.config import ConfigError, ResourceConfig, read_config_file
from ate_devplugin.devices import Discovery, discover, watch_dirs
from ate_devplugin.inventory import HEALTHY, UNHEALTHY, ResourceState
from ate_devplugin.metrics import Metrics
from ate_devplugin.registration import Backoff, RegistrationError, register
from ate_devplugin.server import PluginServer, ServeError, socket_identity
from ate_devplugin.servicer import DevicePluginServicer
from ate_devplugin.settings import Settings
from ate_devplugin.tracing import Tracing
from ate_devplugin.watcher import FsEvent, Watcher, nearest_existing

log = logging.getLogger(__name__)

# After the kubelet's stream ends without a kubelet restart, wait this long for one
# before registering again (a restarting kubelet wipes our socket well within it).
STREAM_GRACE_S = 5.0
STOP_GRACE_S = 1.0


class AgentDiedError(RuntimeError):
    pass


class ResourceAgent:
    def __init__(
        self,
        config: ResourceConfig,
        settings: Settings,
        metrics: Metrics,
        tracing: Tracing,
        check_kubelet: Callable[[], None],
        on_death: Callable[[], None],
    ) -> None:
        self.config = config
        self._check_kubelet = check_kubelet
        self._on_death = on_death
        self.settings = settings
        self.metrics = metrics
        self.tracing = tracing
        self.state = ResourceState(config)
        self.state.on_streams_changed = self.wake
        self.server = PluginServer(
            settings.socket_path(config), DevicePluginServicer(self.state, metrics, tracing.tracer)
        )
        self._wake = asyncio.Event()
        self._backoff = Backoff()
        self._said_waiting = False
        self._cause: context.Context | None = None  # trace context of why we register next
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def wake(self) -> None:
        self._wake.set()

    def kubelet_restarted(self) -> None:
        self.state.registered = False
        self._cause = context.get_current()
        self.wake()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"agent {self.name}")
        self.task.add_done_callback(self._done)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            # An agent that died has said so (_done); its error must not stop the others.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self.task

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("agent for %s died", self.name, exc_info=task.exception())
            self._on_death()

    async def _sleep(self, seconds: float | None) -> bool:
        """Sleeps until woken (True) or until ``seconds`` pass (False)."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        state = self.state
        try:
            while True:
                self._publish()
                self._wake.clear()
                if not state.ever_present:
                    await self._sleep(None)
                elif not self.server.socket_intact():
                    await self._serve()
                elif not state.registered:
                    await self._register()
                elif state.streams == 0:
                    # Registered, but the kubelet holds no stream (not yet, or no more).
                    if not await self._sleep(STREAM_GRACE_S) and state.streams == 0:
                        log.warning(
                            "kubelet holds no ListAndWatch stream; registering again", extra={"resource": self.name}
                        )
                        state.registered = False
                else:
                    await self._sleep(None)
        finally:
            state.close()
            state.registered = False
            self._publish()
            await self.server.stop(STOP_GRACE_S)
            log.info("stopped serving", extra={"resource": self.name})

    def _publish(self) -> None:
        self.metrics.registered.labels(self.name).set(1 if self.state.serving else 0)

    async def _serve(self) -> None:
        if self.state.registered:
            log.info("our socket is gone; serving again", extra={"resource": self.name})
        self.state.registered = False
        await self.server.stop(0)
        try:
            await self.server.start()
        except ServeError as exc:
            log.error("%s", exc, extra={"resource": self.name})
            await self._sleep(self._backoff.next())
            return
        log.info("serving", extra={"resource": self.name, "socket": self.server.socket_path})

    async def _register(self) -> None:
        kubelet = self.settings.kubelet_socket
        if not os.path.exists(kubelet):
            if not self._said_waiting:
                log.info("waiting for the kubelet socket", extra={"resource": self.name, "socket": kubelet})
                self._said_waiting = True
            await self._sleep(None)
            return
        self._said_waiting = False
        # A new kubelet may be up before its socket's creation event reaches us; noticing
        # it here registers once, with the restart as the cause, instead of twice.
        self._check_kubelet()
        try:
            await register(kubelet, self.config.socket_name, self.name, self.tracing.tracer, cause=self._cause)
        except RegistrationError as exc:
            self.metrics.registrations.labels(self.name, exc.reason).inc()
            delay = self._backoff.next()
            log.warning(
                "registration failed, retrying in %.3fs: %s",
                delay,
                exc,
                extra={"resource": self.name, "reason": exc.reason},
            )
            await self._sleep(delay)
            return
        self.metrics.registrations.labels(self.name, "success").inc()
        self._backoff.reset()
        self._cause = None
        self.state.registered = True
        log.info("registered with the kubelet", extra={"resource": self.name})


class Daemon:
    def __init__(
        self, settings: Settings, resources: tuple[ResourceConfig, ...], metrics: Metrics, tracing: Tracing
    ) -> None:
        self.settings = settings
        self.resources = resources
        self.metrics = metrics
        self.tracing = tracing
        self.agents: dict[str, ResourceAgent] = {}
        self._events: asyncio.Queue[FsEvent] = asyncio.Queue()
        self._watcher: Watcher | None = None
        self._agent_died = asyncio.Event()
        # The config file's bytes last read: applied, or rejected and reported once.
        self._config_data = _read(settings.config) if settings.config else None
        # Identity of the kubelet socket we last saw, to tell restarts.
        self._kubelet = socket_identity(settings.kubelet_socket)

    def readiness(self) -> tuple[bool, str]:
        """Ready when every resource whose devices are present is registered and streaming."""
        waiting = [a.name for a in self.agents.values() if a.state.discovery.complete and not a.state.serving]
        if waiting:
            return False, "not registered with a ListAndWatch stream: " + ", ".join(sorted(waiting))
        present = sum(1 for a in self.agents.values() if a.state.discovery.complete)
        return True, f"ok: {present} of {len(self.agents)} resources present and registered"

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self._watcher = Watcher(loop, self._events)
        self._watcher.start()
        for resource in self.resources:
            self._add(resource)
        self._refresh()
        log.info(
            "started",
            extra={
                "resources": [r.name for r in self.resources],
                "device_root": self.settings.device_root,
                "plugin_dir": self.settings.plugin_dir,
            },
        )
        stopping = asyncio.create_task(stop.wait(), name="stop signal")
        dying = asyncio.create_task(self._agent_died.wait(), name="agent death")
        try:
            while True:
                getting = asyncio.create_task(self._events.get(), name="next fs event")
                done, _ = await asyncio.wait({getting, stopping, dying}, return_when=asyncio.FIRST_COMPLETED)
                if dying in done:
                    getting.cancel()
                    # A resource nobody serves any more: exit, so the DaemonSet starts us afresh.
                    raise AgentDiedError("a resource agent died; see the error above")
                if stopping in done:
                    getting.cancel()
                    break
                batch = [getting.result()]
                while not self._events.empty():
                    batch.append(self._events.get_nowait())
                await self._handle(batch)
        finally:
            stopping.cancel()
            dying.cancel()
            await asyncio.gather(*(a.stop() for a in self.agents.values()))
            self._watcher.stop()

    def _add(self, resource: ResourceConfig) -> None:
        self.metrics.add_resource(resource.name)
        agent = ResourceAgent(
            resource, self.settings, self.metrics, self.tracing, self._check_kubelet, self._agent_died.set
        )
        self.agents[resource.name] = agent
        agent.start()

    async def _remove(self, name: str) -> None:
        agent = self.agents.pop(name)
        await agent.stop()
        self.metrics.remove_resource(name)

    async def _handle(self, batch: list[FsEvent]) -> None:
        kubelet = self.settings.kubelet_socket
        config = str(self.settings.config) if self.settings.config else None
        config_dir = os.path.dirname(config) if config else None
        reload = dir_appeared = False
        for event in batch:
            target = event.dest_path if event.kind == "moved" else event.path
            if event.kind in ("created", "moved") and target == kubelet:
                self._check_kubelet()
            elif event.kind in ("deleted", "moved") and not event.is_directory:
                for agent in self.agents.values():
                    if event.path == agent.server.socket_path:
                        agent.wake()  # the agent checks whether its socket is really gone
            if event.is_directory and event.kind in ("deleted", "moved"):
                self._watcher_forget(event.path)
            dir_appeared = dir_appeared or (event.is_directory and event.kind in ("created", "moved"))
            if config_dir and any(os.path.dirname(p) == config_dir for p in event.paths()):
                reload = True
        if reload:
            await self._reload()
        if dir_appeared:
            # Perhaps the plugin directory: agents that could not serve try again now.
            for agent in self.agents.values():
                if not agent.server.socket_intact():
                    agent.wake()
        self._refresh()

    def _watcher_forget(self, path: str) -> None:
        assert self._watcher is not None
        self._watcher.forget(path)

    def _refresh(self) -> None:
        """Arms watches first, then reads the state, so nothing falls between the two."""
        self._rewatch()
        self._rediscover()
        self._check_kubelet()

    def _check_kubelet(self) -> None:
        """Notices a new kubelet by its socket's identity: a restart, seen once however told."""
        current = socket_identity(self.settings.kubelet_socket)
        if current is None or current == self._kubelet:
            return
        restarted, self._kubelet = self._kubelet is not None, current
        if not restarted:
            log.info("kubelet socket appeared")
            for agent in self.agents.values():
                agent.wake()
            return
        self.metrics.kubelet_restarts.inc()
        with self.tracing.tracer.start_as_current_span("kubelet restart", kind=SpanKind.INTERNAL):
            log.info("new kubelet socket: registering again")
            for agent in self.agents.values():
                agent.kubelet_restarted()

    def _rediscover(self) -> None:
        root = self.settings.device_root
        for agent in self.agents.values():
            state = agent.state
            found = discover(agent.config, root)
            was_present = state.ever_present
            if found.complete == state.discovery.complete:
                state.update(found)
            else:
                self._health_change(agent, found)
            units = agent.config.units
            healthy = units if state.health == HEALTHY else 0
            # Units are advertised once the resource was present; before that, none.
            advertised = units if state.ever_present else 0
            self.metrics.devices.labels(agent.name, "healthy").set(healthy)
            self.metrics.devices.labels(agent.name, "unhealthy").set(advertised - healthy)
            self.metrics.device_nodes_present.labels(agent.name).set(len(found.nodes))
            if state.ever_present and not was_present:
                agent.wake()

    def _health_change(self, agent: ResourceAgent, found: Discovery) -> None:
        """Applies a discovery that flips the health, inside the span the kubelet update joins."""
        health = HEALTHY if found.complete else UNHEALTHY
        with self.tracing.tracer.start_as_current_span(
            "device change",
            kind=SpanKind.INTERNAL,
            attributes={
                "ate_devplugin.resource_name": agent.name,
                "ate_devplugin.health": health,
                "ate_devplugin.device_nodes": len(found.nodes),
            },
        ):
            agent.state.update(found)
            self.metrics.health_changes.labels(agent.name, health.lower()).inc()
            log.info(
                "devices %s",
                "present" if found.complete else "absent",
                extra={"resource": agent.name, "nodes": [n.host_path for n in found.nodes]},
            )

    def _rewatch(self) -> None:
        assert self._watcher is not None
        dirs = {nearest_existing(self.settings.plugin_dir)}
        if self.settings.config:
            dirs.add(nearest_existing(os.path.dirname(str(self.settings.config))))
        for agent in self.agents.values():
            dirs |= watch_dirs(agent.config, self.settings.device_root)
        self._watcher.watch(dirs)

    async def _reload(self) -> None:
        assert self.settings.config is not None
        data = _read(self.settings.config)
        if data == self._config_data:
            return  # unchanged, or the same rejected file seen again
        self._config_data = data
        try:
            resources = self.settings.resources_from(data)
        except ConfigError as exc:
            self.metrics.config_reloads.labels("failure").inc()
            log.error("config reload rejected, keeping the running config: %s", exc)
            return
        if resources == self.resources:
            return
        wanted = {r.name: r for r in resources}
        for name in [n for n in self.agents if n not in wanted or self.agents[n].config != wanted[n]]:
            await self._remove(name)
        for name, resource in wanted.items():
            if name not in self.agents:
                self._add(resource)
        self.resources = resources
        self.metrics.config_reloads.labels("success").inc()
        log.info("config reloaded", extra={"resources": list(wanted)})


def _read(path: Path) -> bytes | None:
    """Bounded and non-blocking: a FIFO, a device or a huge file is refused, not read."""
    try:
        return read_config_file(path)
    except ConfigError:
        return None
