"""What the lifecycle needs from the world, as small ports: tests pass fakes.

* :class:`Filesystem`: whether a path exists, and a socket's identity.
* :class:`KubeletClient`: Register with the kubelet.
* :class:`Clock`: monotonic time and sleeping.
* :class:`Server`: one resource's gRPC server on its socket (host.sockets.UnixServer).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.deviceplugin.inventory import ResourceState
from ate_devplugin.deviceplugin.registration import register
from ate_devplugin.host.sockets import SocketId, socket_identity


class Filesystem(Protocol):
    def exists(self, path: str) -> bool: ...

    def socket_identity(self, path: str) -> SocketId | None: ...


class KubeletClient(Protocol):
    async def register(
        self,
        kubelet_socket: str,
        endpoint: str,
        resource_name: str,
        options: pb.DevicePluginOptions,
        cause: Context | None,
    ) -> None:
        """Raises registration.RegistrationError."""


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class Server(Protocol):
    socket_path: str

    async def start(self) -> None:
        """Raises host.sockets.ServeError."""

    def socket_intact(self) -> bool: ...

    async def stop(self, grace: float | None) -> None: ...


class HostFilesystem:
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def socket_identity(self, path: str) -> SocketId | None:
        return socket_identity(path)


@dataclass(frozen=True)
class GrpcKubelet:
    tracer: Tracer
    timeout: float

    async def register(
        self,
        kubelet_socket: str,
        endpoint: str,
        resource_name: str,
        options: pb.DevicePluginOptions,
        cause: Context | None,
    ) -> None:
        await register(kubelet_socket, endpoint, resource_name, options, self.tracer, cause=cause, timeout=self.timeout)


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Ports:
    fs: Filesystem
    kubelet: KubeletClient
    clock: Clock
    make_server: Callable[[ResourceState], Server]
