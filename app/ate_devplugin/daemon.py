"""The daemon: routes typed events to the resource agents and supervises them.

Root tasks are guarded: the event router and every agent; an unexpected end of any of
them ends the daemon (exit 1, so the DaemonSet starts it afresh). Stopping is bounded
and names what did not stop. A batch of events handled too slowly is a stall: /healthz
fails and ``ate_devplugin_lifecycle_stalls_total`` says why.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind

from ate_devplugin import config
from ate_devplugin.config import ConfigError, ResourceConfig
from ate_devplugin.deviceplugin.agent import Ports, ResourceAgent
from ate_devplugin.deviceplugin.events import (
    AgentDied,
    ConfigChanged,
    DirectoryAppeared,
    DirectoryGone,
    Event,
    KubeletSocketCreated,
    Paths,
    PodResourcesChanged,
    SocketGone,
    Stop,
    matters,
    route,
)
from ate_devplugin.deviceplugin.inventory import ResourceState
from ate_devplugin.deviceplugin.podresources import PodResourcesWatch
from ate_devplugin.deviceplugin.ports import GrpcKubelet, HostFilesystem, SystemClock
from ate_devplugin.deviceplugin.server import PluginServer
from ate_devplugin.deviceplugin.servicer import DevicePluginServicer
from ate_devplugin.host.cdi import CdiSpecs
from ate_devplugin.host.devices import Discovery, discover, watch_dirs
from ate_devplugin.host.watcher import FsEvent, Watcher, nearest_existing
from ate_devplugin.observability.metrics import Metrics, PodResourcesMetrics
from ate_devplugin.observability.tracing import Tracing
from ate_devplugin.reload import Worker, WorkerBusyError
from ate_devplugin.settings import Settings

if TYPE_CHECKING:  # imported only in DRA mode
    from ate_devplugin.dra.plugin import DraPlugin

log = logging.getLogger(__name__)

# Written by the kubelet's device manager in the plugin directory.
CHECKPOINT = "kubelet_internal_checkpoint"


class AgentDiedError(RuntimeError):
    pass


def host_ports(settings: Settings, metrics: Metrics, tracing: Tracing) -> Ports:
    def make_server(state: ResourceState) -> PluginServer:
        servicer = DevicePluginServicer(state, metrics, tracing.tracer)
        return PluginServer(settings.socket_path(state.config), servicer, settings.timing.server_stop_margin_s)

    return Ports(
        fs=HostFilesystem(),
        kubelet=GrpcKubelet(tracing.tracer, settings.timing.register_timeout_s),
        clock=SystemClock(),
        make_server=make_server,
    )


class Daemon:
    def __init__(
        self,
        settings: Settings,
        resources: tuple[ResourceConfig, ...],
        metrics: Metrics,
        tracing: Tracing,
        ports: Ports | None = None,
        discover: Callable[[ResourceConfig, str], Discovery] = discover,
        dra: DraPlugin | None = None,
    ) -> None:
        self.settings = settings
        self.timing = settings.timing
        self.resources = resources
        self.metrics = metrics
        self.tracing = tracing
        self.ports = ports or host_ports(settings, metrics, tracing)
        self._discover = discover
        self.dra = dra  # the DRA driver, in mode dra or both
        self.agents: dict[str, ResourceAgent] = {}
        self._retiring: set[ResourceAgent] = set()
        self._inbox: list[FsEvent | Event] = []
        self._arrived = asyncio.Event()
        self._stop: Stop | AgentDied | None = None
        self._stopping = asyncio.Event()
        self._watcher: Watcher | None = None
        self._quiet_dir: str | None = None  # see events.matters; read on the watcher's thread
        self._reader = Worker("config reload")
        self._config_data: bytes | None = None  # the config file's bytes last read
        self._read_failure: str | None = None  # why the file could not be read last time
        self._kubelet = self.ports.fs.socket_identity(settings.kubelet_socket)  # to tell restarts
        self._busy_since: float | None = None
        self._stalls: dict[str, str] = {}  # reason -> what is stuck
        self.pods: PodResourcesWatch | None = None
        if settings.pod_resources:
            self.pods = PodResourcesWatch(
                settings.pod_resources_socket,
                PodResourcesMetrics(metrics.registry),
                tracing.tracer,
                lambda: {name: agent.state.health for name, agent in self.agents.items()},
                interval_s=settings.pod_resources_interval_s,
                debounce_s=self.timing.pod_resources_debounce_s,
                timeout_s=self.timing.pod_resources_timeout_s,
            )
        # The kubelet's checkpoint: rewritten when units are allocated, so pods are read again.
        self._checkpoint = os.path.join(settings.plugin_dir, CHECKPOINT) if self.pods else None
        # CDI specs follow the devices of the resources that answer with CDI names.
        self.cdi = CdiSpecs(settings.cdi_dir, metrics)
        self._cdi_for_all = False
        if dra is not None:  # the DRA driver answers with CDI names only
            self.write_cdi_for_every_resource()

    def write_cdi_for_every_resource(self) -> None:
        """Keeps a CDI spec for every resource, whatever its ``allocate`` says (a DRA
        driver answers with CDI names only). Call before :meth:`run`."""
        self._cdi_for_all = True

    def _wants_cdi(self, resource: ResourceConfig) -> bool:
        return self._cdi_for_all or resource.uses_cdi

    # --- probes -----------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """Ready when every resource whose devices are present is registered and streaming."""
        waiting = [a.name for a in self.agents.values() if a.state.discovery.complete and not a.serving]
        if waiting:
            return False, "not registered with a ListAndWatch stream: " + ", ".join(sorted(waiting))
        if self.dra is not None:
            ready, why = self.dra.readiness()
            if not ready:
                return False, why
        present = sum(1 for a in self.agents.values() if a.state.discovery.complete)
        return True, f"ok: {present} of {len(self.agents)} resources present and registered"

    def liveness(self) -> tuple[bool, str]:
        """Alive while events are handled in time and every agent stopped when told."""
        if self._stalls:
            return False, "; ".join(self._stalls.values())
        return True, "ok"

    # --- what the outside tells ---------------------------------------------------------

    def put(self, event: FsEvent | Event) -> None:
        if isinstance(event, Stop | AgentDied):
            if self._stop is None:
                self._stop = event
            self._stopping.set()
            return
        self._inbox.append(event)
        self._arrived.set()

    def request_stop(self, why: str) -> None:
        self.put(Stop(why))

    def request_reload(self) -> None:
        self.put(ConfigChanged())

    # --- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs until a stop is requested; raises AgentDiedError when an agent died."""
        loop = asyncio.get_running_loop()
        self._watcher = Watcher(loop, self.put, lambda e: matters(e, self._quiet_dir, self._checkpoint))
        self._watcher.start()
        if self.dra is not None:
            await self.dra.start()
        for resource in self.resources:
            self._add(resource)
        self._refresh()
        if self.pods is not None:
            self.pods.start()
        log.info(
            "started",
            extra={
                "resources": [r.name for r in self.resources],
                "device_root": self.settings.device_root,
                "plugin_dir": self.settings.plugin_dir,
            },
        )
        router = asyncio.create_task(self._route_events(), name="event router")
        stopping = asyncio.create_task(self._stopping.wait(), name="stop request")
        try:
            await asyncio.wait({router, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await self._shutdown(router)
        if isinstance(self._stop, AgentDied):
            # A resource nobody serves any more: exit, so the DaemonSet starts us afresh.
            raise AgentDiedError(f"the agent for {self._stop.resource} died; see the error above")
        if router.done() and not router.cancelled() and router.exception() is not None:
            raise AgentDiedError("the event router died") from router.exception()

    async def _shutdown(self, router: asyncio.Task[None]) -> None:
        """Everything down within ``timing.shutdown_deadline_s``; names what is stuck."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timing.shutdown_deadline_s
        if self._stop is not None:
            log.info("stopping", extra={"why": getattr(self._stop, "why", "an agent died")})
        while not router.done() and loop.time() < deadline:
            router.cancel()
            await asyncio.wait({router}, timeout=0.1)
        stops = {asyncio.ensure_future(a.stop()): a.name for a in [*self.agents.values(), *self._retiring]}
        if self.dra is not None:
            stops[asyncio.ensure_future(self.dra.stop(max(0.0, deadline - loop.time() - 0.2)))] = "dra"
        if stops:
            _, pending = await asyncio.wait(stops, timeout=max(0.0, deadline - loop.time()))
            stuck = [stops[s] for s in pending]
            if stuck or not router.done():
                log.error(
                    "shutdown deadline passed; still running: %s",
                    ", ".join([*(f"agent {n}" for n in stuck), *(["event router"] if not router.done() else [])]),
                )
        self.cdi.remove_all()  # no runtime may resolve a name nobody serves
        if self.pods is not None:
            await self.pods.stop()
        if self._watcher is not None:
            self._watcher.stop()

    async def _route_events(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            batch, self._inbox = self._inbox, []
            self._busy_since = loop.time()
            watchdog = loop.call_later(self.timing.event_deadline_s, self._stalled, "event_handling", batch)
            try:
                await self._handle(batch)
            finally:
                watchdog.cancel()
                self._busy_since = None
                self._stalls.pop("event_handling", None)

    def _stalled(self, reason: str, what: object) -> None:
        self.metrics.lifecycle_stalls.labels(reason).inc()
        message = f"{reason}: stuck for over {self.timing.event_deadline_s:.0f}s"
        self._stalls[reason] = message
        log.error("lifecycle stalled: %s", message, extra={"reason": reason, "stuck": repr(what)[:500]})

    async def _handle(self, batch: list[FsEvent | Event]) -> None:
        paths = Paths(
            kubelet_socket=self.settings.kubelet_socket,
            sockets={a.server.socket_path: a.name for a in self.agents.values()},
            config=str(self.settings.config) if self.settings.config else None,
            checkpoint=self._checkpoint,
            pod_resources_socket=self.settings.pod_resources_socket if self.pods else None,
        )
        fs_events = [e for e in batch if isinstance(e, FsEvent)]
        events = route(fs_events, paths) + [e for e in batch if not isinstance(e, FsEvent)]
        reload = False
        for event in events:
            if isinstance(event, KubeletSocketCreated):
                self._check_kubelet()
            elif isinstance(event, SocketGone) and event.resource in self.agents:
                self.agents[event.resource].wake()  # it checks whether its socket is really gone
            elif isinstance(event, DirectoryGone) and self._watcher is not None:
                self._watcher.forget(event.path)
            elif isinstance(event, DirectoryAppeared):
                for agent in self.agents.values():
                    if not agent.server.socket_intact():
                        agent.retry_now()
            elif isinstance(event, ConfigChanged):
                reload = True
            elif isinstance(event, PodResourcesChanged) and self.pods is not None:
                self.pods.refresh()
        if reload and self.settings.config is not None:
            await self._reload()
        self._refresh()

    # --- agents -------------------------------------------------------------------------

    def _add(self, resource: ResourceConfig) -> None:
        if not self.settings.device_plugin:
            return  # DRA only: no device plugin agents
        self.metrics.add_resource(resource.name)
        agent = ResourceAgent(
            resource,
            self.settings.kubelet_socket,
            self.ports,
            self.timing,
            self.metrics,
            self.tracing.tracer,
            check_kubelet=self._check_kubelet,
            on_death=lambda name, exc: self.put(AgentDied(name, exc)),
        )
        self.agents[resource.name] = agent
        agent.start()

    async def _remove(self, name: str) -> None:
        agent = self.agents.pop(name)
        self._retiring.add(agent)
        try:
            if not await agent.stop():
                self.metrics.lifecycle_stalls.labels("agent_stop").inc()
                self._stalls["agent_stop"] = f"agent_stop: the agent for {name} did not stop"
        finally:
            self._retiring.discard(agent)
        if name not in self.agents:  # not added again meanwhile
            self.metrics.remove_resource(name)

    def _refresh(self) -> None:
        """Arms watches first, then reads the state, so nothing falls between the two."""
        self._rewatch()
        found = {r.name: self._discover(r, self.settings.device_root) for r in self.resources}
        for name, agent in self.agents.items():
            before = agent.state.health
            agent.apply_discovery(found[name])
            if self.pods is not None and agent.state.health != before:
                self.pods.health_changed(agent.name, agent.state.health, agent.state.change_context)
        wanted = {r.name for r in self.resources if self._wants_cdi(r)}
        for resource in self.resources:
            if resource.name in wanted:
                self.cdi.write(resource, found[resource.name].nodes)
        for name in self.cdi.resources - wanted:  # left the config, or no longer uses CDI
            self.cdi.remove(name)
        if self.dra is not None:  # after the specs: a published device's CDI name must resolve
            self.dra.update(self.resources, found)
        self._check_kubelet()

    def _rewatch(self) -> None:
        assert self._watcher is not None
        dirs: set[str] = set()
        if self.settings.config:
            dirs.add(nearest_existing(str(self.settings.config.parent)))
        for resource in self.resources:
            dirs |= watch_dirs(resource, self.settings.device_root)
        pod_resources_dir = os.path.dirname(self.settings.pod_resources_socket)
        if self.pods is not None and os.path.isdir(pod_resources_dir):
            dirs.add(pod_resources_dir)  # the kubelet makes its socket anew when it restarts
        self._quiet_dir = None
        if self.settings.device_plugin:
            plugin_dir = self.settings.plugin_dir
            # Only sockets and directories matter in the plugin directory (and the kubelet's
            # checkpoint while pods are read), unless it is watched for the config or devices.
            self._quiet_dir = plugin_dir if plugin_dir not in dirs else None
            dirs.add(nearest_existing(plugin_dir))
        self._watcher.watch(dirs)

    def _check_kubelet(self) -> None:
        """Notices a new kubelet by its socket's identity: a restart, seen once however told."""
        current = self.ports.fs.socket_identity(self.settings.kubelet_socket)
        if current is None or current == self._kubelet:
            return
        restarted, self._kubelet = self._kubelet is not None, current
        if not restarted:
            log.info("kubelet socket appeared")
            for agent in self.agents.values():
                agent.kubelet_changed(restarted=False)
            return
        self.metrics.kubelet_restarts.inc()
        with self.tracing.tracer.start_as_current_span("kubelet restart", kind=SpanKind.INTERNAL):
            log.info("new kubelet socket: registering again")
            for agent in self.agents.values():
                agent.kubelet_changed(restarted=True)

    # --- config reload ------------------------------------------------------------------

    async def _reload(self) -> None:
        path, plugin_dir, previous = self.settings.config, self.settings.plugin_dir, self._config_data
        assert path is not None
        log.debug("reading the config file", extra={"path": str(path)})
        try:
            data, resources = await self._reader.call(
                lambda: config.read_again(path, plugin_dir, previous), self.timing.reload_timeout_s
            )
        except (ConfigError, TimeoutError, WorkerBusyError) as exc:
            self._config_data = None  # read it again next time, even if unchanged
            if str(exc) != self._read_failure:  # the same unreadable file is reported once
                self._read_failure = str(exc)
                self._reload_failed(exc)
            return
        self._read_failure = None
        if resources is None:
            return  # unchanged, or the same rejected file seen again
        self._config_data = data
        if isinstance(resources, ConfigError):
            self._reload_failed(resources)
            return
        self.metrics.config_rejected.set(0)
        if resources == self.resources:
            return
        wanted = {r.name: r for r in resources}
        gone = [n for n in self.agents if n not in wanted or self.agents[n].config != wanted[n]]
        await asyncio.gather(*(self._remove(n) for n in gone))
        for name, resource in wanted.items():
            if name not in self.agents:
                self._add(resource)
        self.resources = resources
        if self.pods is not None:
            self.pods.refresh()  # the series of resources added or gone
        self.metrics.config_reloads.labels("success").inc()
        log.info("config reloaded", extra={"resources": list(wanted)})

    def _reload_failed(self, why: Exception) -> None:
        self.metrics.config_reloads.labels("failure").inc()
        self.metrics.config_rejected.set(1)
        log.error("config reload rejected, keeping the running config: %s", why)
