"""One gRPC server per resource, on its own unix socket in the kubelet's socket directory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass

from ate_devplugin.api.v1beta1 import api_pb2 as pb
from ate_devplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)


STOP_MARGIN_S = 0.5


class ServeError(Exception):
    pass


def device_plugin_handler(servicer: DevicePluginServicer) -> grpc.GenericRpcHandler[Any, Any]:
    """The DevicePlugin service, method by method as the proto declares it.

    ListAndWatch answers are sent as the servicer encoded them: one shared, immutable
    copy per device list instead of a message object per stream and update.
    """
    service = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    handlers = {}
    for method in service.methods:
        request = GetMessageClass(method.input_type)
        serialize: Callable[[Any], bytes] = GetMessageClass(method.output_type).SerializeToString
        make = grpc.unary_unary_rpc_method_handler
        if method.server_streaming:
            make, serialize = grpc.unary_stream_rpc_method_handler, bytes
        handlers[method.name] = make(
            getattr(servicer, method.name), request_deserializer=request.FromString, response_serializer=serialize
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def socket_identity(path: str) -> tuple[int, int, int] | None:
    """Tells one socket file from a later one of the same name, or None when absent.

    The change time is part of it: some filesystems (ext4) give a socket bound again
    right after an unlink the same inode number.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginServer:
    def __init__(self, socket_path: str, servicer: DevicePluginServicer) -> None:
        self.socket_path = socket_path
        self.servicer = servicer
        self._server: grpc.aio.Server | None = None
        self._identity: tuple[int, int, int] | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([device_plugin_handler(self.servicer)])
        try:
            # A socket left by an earlier instance (killed before it could clean up)
            # would make the bind fail; nobody else may own our socket's name.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            server.add_insecure_port(f"unix:{self.socket_path}")
            await server.start()
        except Exception as exc:
            await server.stop(None)
            raise ServeError(f"cannot serve on {self.socket_path}: {exc}") from exc
        self._server = server
        self._identity = socket_identity(self.socket_path)

    def socket_intact(self) -> bool:
        """Whether the socket file on disk is still the one this server created."""
        return self._identity is not None and socket_identity(self.socket_path) == self._identity

    async def stop(self, grace: float | None) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        intact = self.socket_intact()
        self._identity = None
        if intact:
            # First, so the kubelet sees the socket go and nobody new connects.
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # e.g. the directory turned read-only
                log.warning("cannot remove %s: %s", self.socket_path, exc)
        try:
            # A client that stopped reading keeps a write pending for ever, and gRPC then
            # never completes its shutdown: stop waiting shortly after the grace period.
            await asyncio.wait_for(server.stop(grace), (grace or 0.0) + STOP_MARGIN_S)
        except TimeoutError:
            log.warning("gRPC server on %s did not stop in time: a client is not reading", self.socket_path)
