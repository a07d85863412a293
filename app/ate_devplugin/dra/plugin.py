"""The DRA kubelet plugin: the node service, its registration and this node's slices.

Start order follows what the kubelet expects: the DRA service socket first, then the
registration socket (whose appearance makes the kubelet call GetInfo and dial the
service at once). Stop order is the reverse: the registration socket goes first, so the
kubelet deregisters before the service disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Protocol

import grpc
from opentelemetry.trace import Tracer

from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.server import bind_socket
from ate_devplugin.dra import registration, service
from ate_devplugin.dra.registration import RegistrationServicer
from ate_devplugin.dra.service import ClaimReader, DraDriver
from ate_devplugin.dra.slices import SliceApi, SlicePublisher, slot_devices
from ate_devplugin.host.devices import Discovery
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.settings import DRA_DRIVER, Settings

log = logging.getLogger(__name__)


class ApiServer(ClaimReader, SliceApi, Protocol):
    """What the driver asks of the API server (kube.KubeApi on a real one)."""

    async def close(self) -> None: ...


class DraPlugin:
    def __init__(
        self,
        settings: Settings,
        api: ApiServer,
        cdi_id: Callable[[str], str],
        metrics: DraMetrics,
        tracer: Tracer,
    ) -> None:
        self.settings = settings
        self.api = api
        self.cdi_id = cdi_id
        self.metrics = metrics
        self.tracer = tracer
        self.publisher = SlicePublisher(api, DRA_DRIVER, settings.node_name, metrics)
        self.driver = DraDriver(DRA_DRIVER, settings.node_name, self._lookup, api, metrics)
        self.registration = RegistrationServicer(
            DRA_DRIVER, settings.dra_socket, lambda registered: metrics.registered.set(int(registered))
        )
        self._servers: list[tuple[str, grpc.aio.Server]] = []

    def _lookup(self, device: str) -> str | None:
        resource = self.publisher.devices.get(device)
        return None if resource is None else self.cdi_id(resource)

    def readiness(self) -> tuple[bool, str]:
        if not self.registration.registered:
            return False, "DRA driver not registered with the kubelet" + (
                f": {self.registration.error}" if self.registration.error else ""
            )
        if not self.publisher.synced.is_set():
            return False, "resource slices not yet published"
        return True, "DRA driver registered, slices published"

    async def start(self) -> None:
        dra = grpc.aio.server()
        service.add_to_server(self.driver, self.tracer, dra)
        await self._serve(self.settings.dra_socket, dra)
        reg = grpc.aio.server()
        registration.add_to_server(self.registration, reg)
        await self._serve(self.settings.registration_socket, reg)
        self.publisher.start()
        log.info(
            "DRA driver serving",
            extra={"driver": DRA_DRIVER, "node": self.settings.node_name, "socket": self.settings.dra_socket},
        )

    def update(self, resources: tuple[ResourceConfig, ...], discoveries: Mapping[str, Discovery]) -> None:
        """Publishes the resources whose device nodes are all present (their CDI specs are written by then)."""
        present = [r.name for r in resources if discoveries[r.name].complete]
        self.publisher.publish(slot_devices(present, self.settings.dra_slots))

    async def _serve(self, path: str, server: grpc.aio.Server) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        bind_socket(server, path)
        await server.start()
        self._servers.append((path, server))

    async def stop(self, deadline_s: float) -> bool:
        """Sockets removed and slices deleted, within ``deadline_s`` for the API calls."""
        for path, server in reversed(self._servers):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            await server.stop(0.2)
        self._servers = []
        try:
            await asyncio.wait_for(self.publisher.stop(), deadline_s)
        except Exception as exc:  # a failed cleanup must not hold the exit
            log.error("could not delete this node's resource slices: %r", exc)
        await self.api.close()
        return True
