"""The DRA kubelet plugin: the node service, device health, its registration and this node's slices.

Start order follows what the kubelet expects: the DRA service socket first, then the
registration socket (whose appearance makes the kubelet call GetInfo and dial the
service at once). Stop order is the reverse: the registration socket goes first, so the
kubelet deregisters before the service disappears.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Protocol

import grpc
from opentelemetry.trace import Tracer

from ate_devplugin.components import ClaimsChanged, Tell
from ate_devplugin.config import ResourceConfig
from ate_devplugin.dra import health, registration, service
from ate_devplugin.dra.health import DeviceReport, HealthBoard
from ate_devplugin.dra.registration import RegistrationServicer
from ate_devplugin.dra.service import ClaimReader, DraDriver
from ate_devplugin.dra.slices import SliceApi, SliceDevice, SlicePublisher, resource_devices
from ate_devplugin.dra.taints import TaintBook
from ate_devplugin.host.sockets import UnixServer
from ate_devplugin.observability.logs import reason
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.settings import DraSettings
from ate_devplugin.tasks import Guard
from ate_devplugin.view import ResourceView, View

log = logging.getLogger(__name__)

# Grace for the kubelet's calls in flight when the driver stops.
STOP_GRACE_S = 0.2
# Deleting this node's slices at stop, of the daemon's few seconds to exit: an API server
# that does not answer costs this much, and the kubelet deletes the slices 30 s later.
STOP_SLICES_S = 1.0
CLOSE_S = 0.2


class ApiServer(ClaimReader, SliceApi, Protocol):
    """What the driver asks of the API server (kube.KubeApi on a real one)."""

    async def close(self) -> None: ...


class DraPlugin:
    name = "DRA driver"

    def __init__(
        self,
        settings: DraSettings,
        api: ApiServer,
        cdi_id: Callable[[str], str],
        metrics: DraMetrics,
        tracer: Tracer,
        cdi_problem: Callable[[str], str] = lambda _: "",
    ) -> None:
        self.settings = settings
        self.api = api
        self.cdi_id = cdi_id
        self.cdi_problem = cdi_problem
        self.metrics = metrics
        self.tracer = tracer
        driver, node = settings.driver, settings.node_name
        self.publisher = SlicePublisher(api, driver, node, metrics, sharing=settings.dra_sharing == "capacity")
        self.driver = DraDriver(driver, node, self._lookup, api, metrics, self._cdi_problem, self._claims_changed)
        self.health = HealthBoard()
        self.registration = RegistrationServicer(
            driver, settings.socket, lambda registered: metrics.registered.set(int(registered))
        )
        self._tell: Tell | None = None  # told ClaimsChanged after every prepare and unprepare answered
        self._names: dict[str, str] = {}  # every device name a configured resource may publish -> the resource
        self._servers: list[UnixServer] = []
        # Device name -> resource, of every present resource's devices in the configured
        # model: a claim the scheduler allocated just before a fallback to slots still prepares.
        self._present: dict[str, str] = {}
        self._healthy: dict[str, bool] = {}  # resource -> its devices' health in the last view
        self.taints = TaintBook(driver, settings.dra_taint_effect)

    def _lookup(self, device: str) -> str | None:
        """The one place prepare asks for a device's CDI ID (``cdi_id``: host.cdi's answer)."""
        resource = self._present.get(device)
        return None if resource is None else self.cdi_id(resource)

    def _cdi_problem(self, device: str) -> str:
        resource = self._present.get(device)
        return "" if resource is None else self.cdi_problem(resource)

    def _devices(self, resource: ResourceConfig, shared: bool) -> list[SliceDevice]:
        return resource_devices(resource.name, resource.units, self.settings.dra_slots, shared)

    def _published(self, view: ResourceView, shared: bool) -> list[SliceDevice]:
        """The devices as published: a probed resource's with the node's virtualisation facts
        as attributes, and a taint while its probe fails."""
        r = view.config
        if view.kvm is None:
            return self._devices(r, shared)
        taints = self.taints.taints(r.name)
        return resource_devices(r.name, r.units, self.settings.dra_slots, shared, view.kvm.attributes(), taints)

    def device_resources(self) -> dict[str, str]:
        """Every device a configured resource may publish (present or not, shared or a
        slot), by name, with its resource."""
        return self._names

    def _configured(self, resources: tuple[ResourceConfig, ...]) -> None:
        self._names = {d.name: d.resource for r in resources for d in self._devices(r, shared=True)}

    def _claims_changed(self) -> None:
        assert self._tell is not None, "told where to tell (tell_to) before it serves"
        self._tell(ClaimsChanged())

    def tell_to(self, tell: Tell) -> None:
        self._tell = tell

    # --- the component --------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        """Raises host.sockets.ServeError when a socket cannot be served."""
        self._configured(resources)
        sockets: list[tuple[str, Callable[[grpc.aio.Server], None]]] = [
            (self.settings.socket, self._add_node_services),
            (self.settings.registration_socket, lambda server: registration.add_to_server(self.registration, server)),
        ]
        for path, add_services in sockets:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            server = UnixServer(path, add_services)
            await server.start()
            self._servers.append(server)
        self.publisher.start(guard)
        log.info(
            "DRA driver serving",
            extra={"driver": self.settings.driver, "node": self.settings.node_name, "socket": self.settings.socket},
        )

    def _add_node_services(self, server: grpc.aio.Server) -> None:
        service.add_to_server(self.driver, self.tracer, server)
        health.add_to_server(self.health, self.settings.node_name, self.metrics, server)

    async def stop(self, deadline_s: float) -> list[str]:
        """Sockets removed and slices deleted, within ``deadline_s`` for the API calls."""
        for server in reversed(self._servers):
            await server.stop(STOP_GRACE_S)
        self._servers = []
        try:
            await asyncio.wait_for(self.publisher.stop(), min(deadline_s, STOP_SLICES_S))
        except Exception as exc:  # a failed cleanup must not hold the exit
            log.error("could not delete this node's resource slices: %s", reason(exc))
        try:
            await asyncio.wait_for(self.api.close(), CLOSE_S)
        except Exception as exc:
            log.warning("could not close the API client: %s", reason(exc))
        return []

    def readiness(self) -> tuple[bool, str]:
        if not self.registration.registered:
            return False, "DRA driver not registered with the kubelet" + (
                f": {self.registration.error}" if self.registration.error else ""
            )
        if not self.publisher.synced.is_set():
            return False, "resource slices not yet published"
        return True, "DRA driver registered, slices published"

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self._configured(resources)  # published at the view that follows

    def on_view(self, view: View) -> None:
        """Publishes the resources whose device nodes are all present (the CDI specs render the
        same view before the publisher's task runs), and reports every resource's devices
        healthy or not."""
        shared = self.settings.dra_sharing == "capacity"
        for v in view.values():
            self.taints.update(v.name, None if v.verdict is None else v.verdict.reason)
        wanted = [d for v in view.values() if v.present for d in self._published(v, shared)]
        self._present = {d.name: d.resource for d in wanted}
        self.publisher.publish(wanted)
        reports = []
        for v in view.values():
            self._note_health(v.name, v.healthy)
            text = f"{v.name}: {v.why}"
            reports += [DeviceReport(d.name, v.healthy, text) for d in self._devices(v.config, self.publisher.sharing)]
        self.health.update(reports)
        for gone in set(self._healthy) - view.keys():  # left the config: its series go
            del self._healthy[gone]
            for gauge in (self.metrics.health_changed, self.metrics.slice_devices, self.metrics.tainted_devices):
                gauge.remove(gone)

    def _note_health(self, resource: str, healthy: bool) -> None:
        """The time of a change of the resource's health (absent until first seen present)."""
        gauge = self.metrics.health_changed.labels(resource)  # at 0 from the first view
        if healthy != self._healthy.get(resource, False):
            gauge.set_to_current_time()
        self._healthy[resource] = healthy
