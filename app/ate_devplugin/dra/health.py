"""Device health for the kubelet, which shows it in the pod's status (Kubernetes 1.36+).

The kubelet opens NodeWatchResources once per registered driver and keeps it open; every
message is the full list of the driver's devices. It takes a device as Unknown once the
report's time is older than the report's timeout, so the list goes out again every
``resend_s`` with the current time, and at once when health changes. Served as v1 (1.37
prefers it) and v1alpha1 (the only one 1.36 speaks; 1.37 keeps it until 1.40).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from ate_devplugin.api.drahealth.v1 import api_pb2 as v1
from ate_devplugin.api.drahealth.v1 import api_pb2_grpc as v1_grpc
from ate_devplugin.api.drahealth.v1alpha1 import api_pb2 as v1alpha1
from ate_devplugin.api.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from ate_devplugin.observability.metrics import DraMetrics

log = logging.getLogger(__name__)

# The kubelet's default timeout, said explicitly; a resend every third of it survives a
# late one.
TIMEOUT_S = 30
RESEND_S = 10.0
MESSAGE_MAX = 1024  # the kubelet keeps this much of a message


@dataclass(frozen=True)
class DeviceReport:
    device: str
    healthy: bool
    message: str


class HealthBoard:
    """The driver's devices and their health; watchers wait on :meth:`changed`."""

    def __init__(self) -> None:
        self.reports: tuple[DeviceReport, ...] = ()
        self._changed = asyncio.Event()

    def update(self, reports: Sequence[DeviceReport]) -> None:
        reports = tuple(reports)
        if reports == self.reports:
            return
        self.reports = reports
        self._changed.set()  # wakes every watcher of the list it had
        self._changed = asyncio.Event()

    def changed(self) -> asyncio.Event:
        """Set once the list differs from the one current now."""
        return self._changed


def message(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 3] + "..."


class HealthServicer:
    """One DRAResourceHealth service version."""

    def __init__(
        self,
        board: HealthBoard,
        pool: str,
        pb: ModuleType,
        metrics: DraMetrics,
        resend_s: float = RESEND_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.pool = pool
        self.pb = pb
        self.metrics = metrics
        self.resend_s = resend_s
        self.clock = clock
        self.version = pb.DESCRIPTOR.package

    def response(self) -> Any:
        now = int(self.clock())
        return self.pb.NodeWatchResourcesResponse(
            devices=[
                self.pb.DeviceHealth(
                    device=self.pb.DeviceIdentifier(pool_name=self.pool, device_name=r.device),
                    health=self.pb.HEALTHY if r.healthy else self.pb.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=TIMEOUT_S,
                    message=message(r.message),
                )
                for r in self.board.reports
            ]
        )

    async def NodeWatchResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        log.info("the kubelet watches device health", extra={"version": self.version})
        self.metrics.health_streams.labels(self.version).inc()
        try:
            while True:
                changed = self.board.changed()  # taken before the list is read: no change is missed
                yield self.response()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.resend_s)
        finally:
            self.metrics.health_streams.labels(self.version).dec()


def add_to_server(board: HealthBoard, pool: str, metrics: DraMetrics, server: grpc.aio.Server) -> None:
    """Serves v1 and v1alpha1 on one server."""
    for pb, grpc_mod in ((v1, v1_grpc), (v1alpha1, v1alpha1_grpc)):
        grpc_mod.add_DRAResourceHealthServicer_to_server(HealthServicer(board, pool, pb, metrics), server)
