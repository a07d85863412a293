"""Fakes for unit tests of the agent and the daemon (no root, no sockets), and a
PodResources peer on a unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.context import Context

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.podresources.v1 import api_pb2 as prpb
from ate_devplugin.api.podresources.v1 import api_pb2_grpc as prpb_grpc
from ate_devplugin.deviceplugin.inventory import ResourceState
from ate_devplugin.deviceplugin.ports import Ports
from ate_devplugin.deviceplugin.registration import RegistrationError
from ate_devplugin.host.sockets import ServeError, SocketId


@dataclass
class FakeFs:
    present: set[str] = field(default_factory=set)
    identities: dict[str, SocketId] = field(default_factory=dict)

    def exists(self, path: str) -> bool:
        return path in self.present or path in self.identities

    def socket_identity(self, path: str) -> SocketId | None:
        return self.identities.get(path)


@dataclass
class FakeKubelet:
    """Each Register pops the next outcome: None succeeds, a reason fails, "hang" never answers."""

    outcomes: list[str | None] = field(default_factory=list)
    calls: int = 0
    options: list[pb.DevicePluginOptions] = field(default_factory=list)
    opens_stream: list[ResourceState] = field(default_factory=list)
    streams_of: Callable[[str], ResourceState | None] | None = None

    async def register(
        self,
        kubelet_socket: str,
        endpoint: str,
        resource_name: str,
        options: pb.DevicePluginOptions,
        cause: Context | None,
    ) -> None:
        self.calls += 1
        self.options.append(options)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome == "hang":
            await asyncio.Event().wait()
        if outcome is not None:
            raise RegistrationError(outcome, f"register {resource_name}: {outcome}")
        for state in self.opens_stream:  # the kubelet opens its stream within Register
            state.stream_opened()
        found = self.streams_of(resource_name) if self.streams_of else None
        if found is not None:
            found.stream_opened()


@dataclass
class FakeClock:
    """Time moves only when something sleeps: backoffs and graces pass at once."""

    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.now += max(0.0, seconds)


@dataclass
class FakeServer:
    socket_path: str
    fail_starts: int = 0
    crash: bool = False  # start raises what no agent expects
    starts: int = 0
    stops: int = 0
    intact: bool = False

    async def start(self) -> None:
        self.starts += 1
        if self.crash:
            raise RuntimeError("injected")
        if self.fail_starts:
            self.fail_starts -= 1
            raise ServeError(f"cannot serve on {self.socket_path}: injected")
        self.intact = True

    def socket_intact(self) -> bool:
        return self.intact

    async def stop(self, grace: float | None) -> None:
        self.stops += 1
        self.intact = False


def fake_ports(fs: FakeFs, kubelet: FakeKubelet, clock: FakeClock, servers: dict[str, FakeServer]) -> Ports:
    def make_server(state: ResourceState) -> FakeServer:
        server = servers.setdefault(state.config.name, FakeServer(f"/plugins/{state.config.socket_name}"))
        return server

    return Ports(fs=fs, kubelet=kubelet, clock=clock, make_server=make_server)


async def until(check: object, what: str, timeout: float = 5.0) -> None:
    """Yields to the loop until ``check()`` holds (real time only bounds a failure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.001)


# --- a PodResources peer (the kubelet's List) ------------------------------------

KVM = "ate.dev/kvm"
TUN = "ate.dev/tun"


def pod(namespace: str, name: str, *containers: tuple[str, str, int]) -> prpb.PodResources:
    """A pod whose containers hold (container, resource, units)."""
    return prpb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            prpb.ContainerResources(
                name=c,
                devices=[prpb.ContainerDevices(resource_name=r, device_ids=[f"{r}-{i}" for i in range(n)])],
            )
            for c, r, n in containers
        ],
    )


def claimed(namespace: str, name: str, container: str, *devices: tuple[str, str, str]) -> prpb.PodResources:
    """A pod whose one container holds DRA claims' devices: (claim, driver, device) each,
    as the kubelet lists them (a claim's devices together, each CDI name after those of the
    devices before it)."""
    by_claim: dict[str, list[tuple[str, str]]] = {}
    for claim, driver, device in devices:
        by_claim.setdefault(claim, []).append((driver, device))
    dynamic = []
    for claim, entries in by_claim.items():
        cdi: list[prpb.CDIDevice] = []
        resources = []
        for driver, device in entries:
            cdi = [*cdi, prpb.CDIDevice(name=f"{driver}/x={device}")]
            resources.append(
                prpb.ClaimResource(cdi_devices=cdi, driver_name=driver, pool_name="node", device_name=device)
            )
        dynamic.append(prpb.DynamicResource(claim_name=claim, claim_namespace=namespace, claim_resources=resources))
    return prpb.PodResources(
        name=name, namespace=namespace, containers=[prpb.ContainerResources(name=container, dynamic_resources=dynamic)]
    )


class FakeLister(prpb_grpc.PodResourcesListerServicer):
    """Answers List with ``pods``, or fails with ``fail`` when set."""

    def __init__(self) -> None:
        self.pods: list[prpb.PodResources] = []
        self.fail: grpc.StatusCode | None = None
        self.calls = 0

    async def List(self, request: prpb.ListPodResourcesRequest, context: Any) -> prpb.ListPodResourcesResponse:
        self.calls += 1
        if self.fail is not None:
            await context.abort(self.fail, "injected")
        return prpb.ListPodResourcesResponse(pod_resources=self.pods)


async def serve(socket: Path, lister: FakeLister) -> grpc.aio.Server:
    server = grpc.aio.server()
    prpb_grpc.add_PodResourcesListerServicer_to_server(lister, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server
