"""The device-plugin component: one agent per resource it serves, and the kubelet's identity.

It serves the configured resources (not in mode dra) and, with the prober, each probed
resource's prober resource (probers.py). It adds and removes agents as the resource list
changes, hands each agent its resource's view (view.py), and tells them of what the filesystem
says: a new kubelet (its socket made anew), their own socket gone, a directory made
(perhaps the plugin directory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer

from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin import events, probers
from ate_devplugin.deviceplugin.agent import ResourceAgent
from ate_devplugin.deviceplugin.ports import Ports
from ate_devplugin.host.devices import Discovery
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.settings import DevicePluginSettings
from ate_devplugin.tasks import Guard
from ate_devplugin.view import View

log = logging.getLogger(__name__)


class DevicePlugin:
    name = "device plugin"

    def __init__(self, settings: DevicePluginSettings, ports: Ports, metrics: Metrics, tracer: Tracer) -> None:
        self.settings = settings
        self.ports = ports
        self.metrics = metrics
        self.tracer = tracer
        self.agents: dict[str, ResourceAgent] = {}
        self._retiring: set[ResourceAgent] = set()
        self._guard: Guard | None = None
        self._kubelet = ports.fs.socket_identity(settings.kubelet_socket)  # to tell restarts
        self._stuck: str | None = None
        self._waiting = SaidOnce()  # the info line about a missing kubelet socket
        self._probed: dict[str, str] = {}  # each prober resource served -> the resource it probes
        self._unserved = SaidOnce(remember=64)  # prober resources that cannot be served, said once

    def change_context(self, resource: str) -> Context | None:
        """The trace context of the resource's last health change (its ``device change`` span)."""
        agent = self.agents.get(resource)
        return agent.state.change_context if agent is not None else None

    # --- the component --------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        self._guard = guard
        for resource in self._served(resources).values():
            self._add(resource)

    async def stop(self, deadline_s: float) -> list[str]:
        stops = {asyncio.ensure_future(a.stop()): a.name for a in [*self.agents.values(), *self._retiring]}
        if not stops:
            return []
        _, pending = await asyncio.wait(stops, timeout=deadline_s)
        return [f"agent {stops[s]}" for s in pending]

    def readiness(self) -> tuple[bool, str]:
        """Ready when every resource whose devices are present is registered and streaming."""
        waiting = [a.name for a in self.agents.values() if a.state.discovery.complete and not a.serving]
        if waiting:
            return False, "not registered with a ListAndWatch stream: " + ", ".join(sorted(waiting))
        present = sum(1 for a in self.agents.values() if a.state.discovery.complete)
        return True, f"ok: {present} of {len(self.agents)} resources present and registered"

    def liveness(self) -> tuple[bool, str]:
        return (False, self._stuck) if self._stuck else (True, "ok")

    def watches(self) -> Watches:
        # Only the kubelet's socket and ours matter in the plugin directory: ours from the
        # first discovery of its devices on (the agent serves from then on).
        ours = (a.socket_path for a in self.agents.values() if a.state.ever_present)
        return Watches(sockets=frozenset({self.settings.kubelet_socket, *ours}))

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        sockets = {a.socket_path: a.name for a in self.agents.values()}
        for event in events.route(batch, self.settings.kubelet_socket, sockets):
            if isinstance(event, events.KubeletSocketCreated):
                self._check_kubelet()
            elif isinstance(event, events.SocketGone) and event.resource in self.agents:
                self.agents[event.resource].wake()  # it checks whether its socket is really gone
            elif isinstance(event, events.DirectoryAppeared):
                for agent in self.agents.values():
                    if not agent.socket_intact():
                        agent.retry_now()

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        wanted = self._served(resources)
        gone = [n for n in self.agents if n not in wanted or not wanted[n].serves_as(self.agents[n].config)]
        await asyncio.gather(*(self._remove(n) for n in gone))
        for name, resource in wanted.items():
            if name not in self.agents:
                self._add(resource)

    def on_view(self, view: View) -> None:
        """Each agent its resource's devices, Unhealthy while absent or while a KVM verdict fails."""
        for name, agent in self.agents.items():
            probed = self._probed.get(name)
            if probed is not None:  # a prober's resource: whatever of the device is there, Healthy
                agent.apply(Discovery(view[probed].found.nodes, complete=True))
                continue
            failing = view[name].failing
            agent.apply(view[name].found, None if failing is None else str(failing.reason))
        self._check_kubelet()

    # --- agents ---------------------------------------------------------------------

    def _served(self, resources: tuple[ResourceConfig, ...]) -> dict[str, ResourceConfig]:
        """The configured resources it serves, and the prober's resource of each probed one."""
        served = {r.name: r for r in resources} if self.settings.serves_resources else {}
        self._probed = {}
        for probed in (r for r in resources if r.probes_kvm and self.settings.serves_probers):
            prober = probers.prober_resource(probed)
            why = probers.problem(prober, {r.name: r for r in resources}, self.settings.socket_path(prober))
            if why:
                if self._unserved.new(why, prober.name):
                    log.error("cannot serve the KVM prober's resource %s: %s", prober.name, why)
                continue
            self._unserved.over(prober.name)
            served[prober.name] = prober
            self._probed[prober.name] = probed.name
        return served

    def _add(self, resource: ResourceConfig) -> None:
        assert self._guard is not None, "started"
        self.metrics.add_resource(resource.name)
        agent = ResourceAgent(
            resource, self.settings, self.ports, self.metrics, self.tracer, check_kubelet=self._check_kubelet
        )
        self.agents[resource.name] = agent
        agent.start(self._guard)

    async def _remove(self, name: str) -> None:
        agent = self.agents.pop(name)
        self._retiring.add(agent)
        try:
            if not await agent.stop():
                self.metrics.lifecycle_stalls.labels("agent_stop").inc()
                self._stuck = f"agent_stop: the agent for {name} did not stop"
        finally:
            self._retiring.discard(agent)
        if name not in self.agents:  # not added again meanwhile
            self.metrics.remove_resource(name)

    def _say_waiting(self) -> None:
        """Where the kubelet's socket is awaited: at info once (a wrong --plugin-dir shows
        at once, devices present or not), then at debug on each later check."""
        socket = self.settings.kubelet_socket
        level = logging.INFO if self._waiting.new(socket) else logging.DEBUG
        log.log(level, "waiting for the kubelet socket at %s", socket, extra={"socket": socket})

    def _check_kubelet(self) -> None:
        """Notices a new kubelet by its socket's identity: a restart, seen once however told."""
        current = self.ports.fs.socket_identity(self.settings.kubelet_socket)
        if current is None:
            self._say_waiting()
            return
        self._waiting.over()
        if current == self._kubelet:
            return
        restarted, self._kubelet = self._kubelet is not None, current
        if not restarted:
            log.info("kubelet socket appeared")
            for agent in self.agents.values():
                agent.kubelet_changed(restarted=False)
            return
        self.metrics.kubelet_restarts.inc()
        with self.tracer.start_as_current_span("kubelet restart", kind=SpanKind.INTERNAL):
            log.info("new kubelet socket: registering again")
            for agent in self.agents.values():
                agent.kubelet_changed(restarted=True)
