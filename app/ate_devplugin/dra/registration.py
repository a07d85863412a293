"""Registering the DRA driver with the kubelet's plugin watcher.

The kubelet watches its ``plugins_registry`` directory; for each socket there it calls
GetInfo (within 1 s) and then NotifyRegistrationStatus. It deregisters a plugin only when
its socket file goes, so this server just answers and records what the kubelet said.
The kubelet's error string is clipped before it reaches /readyz or a log line, and a
refusal is logged once per distinct error (the kubelet repeats it with every retry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from ate_devplugin.api.pluginregistration.v1 import api_pb2 as pb
from ate_devplugin.api.pluginregistration.v1 import api_pb2_grpc
from ate_devplugin.observability.logs import SaidOnce, clip

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# The kubelet takes the first node service it knows, the newest first, and (1.37) the
# newest health service listed; 1.35 and 1.36 ignore the health entries (1.36 dials
# v1alpha1 whatever the list says).
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
REMEMBERED_ERRORS = 16  # distinct refusals already logged, the oldest forgotten first


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool], None] = lambda registered: None) -> None:
        self.driver = driver
        self.on_status = on_status
        self.endpoint = endpoint  # the DRA service socket, as the kubelet sees it
        self.registered: bool | None = None  # None until the kubelet told us
        self.error = ""  # clipped
        self._refusals = SaidOnce(REMEMBERED_ERRORS)

    async def GetInfo(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=SUPPORTED_VERSIONS
        )

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.RegistrationStatusResponse:
        self.registered, self.error = request.plugin_registered, clip(request.error)
        self.on_status(request.plugin_registered)
        if request.plugin_registered:
            self._refusals.over()
            log.info("registered with the kubelet as a DRA driver", extra={"driver": self.driver})
        elif self._refusals.new(self.error):
            log.error("the kubelet refused the DRA driver: %s", self.error, extra={"driver": self.driver})
        return pb.RegistrationStatusResponse()


def add_to_server(servicer: RegistrationServicer, server: grpc.aio.Server) -> None:
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
