"""One gRPC server per resource, on its own unix socket in the kubelet's socket directory."""

from __future__ import annotations

import contextlib
import logging
import os

import grpc

from ate_devplugin.api.v1beta1 import api_pb2_grpc
from ate_devplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)


class ServeError(Exception):
    pass


class PluginServer:
    def __init__(self, socket_path: str, servicer: DevicePluginServicer) -> None:
        self.socket_path = socket_path
        self.servicer = servicer
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int] | None = None

    async def start(self) -> None:
        # A socket left by an earlier instance (killed before it could clean up) would
        # make the bind fail; nobody else may own our socket's name.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]  # generated code is unannotated
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
            await server.start()
            st = os.stat(self.socket_path)
        except Exception as exc:
            await server.stop(None)
            raise ServeError(f"cannot serve on {self.socket_path}: {exc}") from exc
        self._server = server
        self._inode = (st.st_dev, st.st_ino)

    def socket_intact(self) -> bool:
        """Whether the socket file on disk is still the one this server created."""
        if self._inode is None:
            return False
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._inode

    async def stop(self, grace: float | None) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        intact = self.socket_intact()
        self._inode = None
        await server.stop(grace)
        if intact:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
