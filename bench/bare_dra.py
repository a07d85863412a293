"""The Python floor of the DRA path: the least a DRA driver on grpc.aio and lightkube does.

    python -m bench.bare_dra DRIVER NODE REGISTRY_DIR SOCKET_DIR DEVICES

Serves the kubelet's plugin registration (GetInfo, NotifyRegistrationStatus) and the
DRA service v1 on grpc.aio, creates one ResourceSlice of DEVICES devices for NODE at
start (credentials from KUBECONFIG), and answers NodePrepareResources by reading each
claim from the API server (as any driver must: the request names the claim, not its
devices) and returning one CDI device per allocated result; NodeUnprepareResources
always succeeds. No checks, metrics, tracing, logs, watch or retry: it never writes its
slice again, so it has no figure after a kubelet restart. Prints ``ready`` once serving.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any, cast

import grpc
from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from ate_devplugin.api.dra.v1 import api_pb2 as dra
from ate_devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from ate_devplugin.api.pluginregistration.v1 import api_pb2 as reg
from ate_devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin", name=self.driver, endpoint=self.endpoint, supported_versions=["v1.DRAPlugin"]
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        return reg.RegistrationStatusResponse()


class Plugin(dra_grpc.DRAPluginServicer):
    def __init__(self, client: AsyncClient, driver: str) -> None:
        self.client = client
        self.driver = driver

    async def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest, context: Any) -> Any:
        response = dra.NodePrepareResourcesResponse()
        for ref in request.claims:
            claim = (await self.client.get(ResourceClaim, ref.name, namespace=ref.namespace)).to_dict()
            answer = response.claims[ref.uid]
            for result in claim["status"]["allocation"]["devices"]["results"]:
                answer.devices.add(
                    request_names=[result["request"]],
                    pool_name=result["pool"],
                    device_name=result["device"],
                    cdi_device_ids=[f"{self.driver}/bare={result['device']}"],
                )
        return response

    async def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest, context: Any) -> Any:
        response = dra.NodeUnprepareResourcesResponse()
        for ref in request.claims:
            response.claims[ref.uid].SetInParent()
        return response


async def main(driver: str, node: str, registry_dir: str, socket_dir: str, devices: int) -> None:
    client = AsyncClient(field_manager="bare-dra")
    endpoint = os.path.join(socket_dir, "dra.sock")
    registration = os.path.join(registry_dir, f"{driver}-reg.sock")
    service, registrar = grpc.aio.server(), grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(Plugin(client, driver), service)  # type: ignore[no-untyped-call]
    reg_grpc.add_RegistrationServicer_to_server(Registration(driver, endpoint), registrar)  # type: ignore[no-untyped-call]
    servers = [service, registrar]  # the service first: the registration makes the kubelet dial it
    for path, server in ((endpoint, service), (registration, registrar)):
        server.add_insecure_port(f"unix:{path}")
        await server.start()
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"dev-{i}"} for i in range(devices)],
        },
    }
    await client.create(cast(ResourceSlice, ResourceSlice.from_dict(body)))
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for path in (registration, endpoint):
        os.unlink(path)
    for server in servers:
        await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
