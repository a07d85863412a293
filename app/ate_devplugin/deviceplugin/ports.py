"""What the lifecycle needs from the world, as small ports: tests pass fakes.

* :class:`Filesystem`: whether a path exists, and a socket's identity.
* :class:`KubeletClient`: Register with the kubelet.
* :class:`Clock`: monotonic time and sleeping.
* :class:`Server`: one resource's gRPC server on its socket (server.PluginServer).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.deviceplugin.registration import register

# (st_dev, st_ino, st_mtime_ns) of a socket file.
SocketId = tuple[int, int, int]


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
        """Raises server.ServeError."""

    def socket_intact(self) -> bool: ...

    async def stop(self, grace: float | None) -> None: ...


def socket_identity(path: str) -> SocketId | None:
    """Tells one socket file from a later one of the same name; None unless a socket is there.

    Not followed through symlinks: a symlink (or a file) renamed over a socket is not it.
    The modification time is part of it because some filesystems (ext4) give a socket
    bound again right after an unlink the same inode number; unlike the change time, it
    stays put when the socket's mode or owner changes.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


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
