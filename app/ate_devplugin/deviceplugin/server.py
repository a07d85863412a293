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

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.deviceplugin.ports import SocketId, socket_identity
from ate_devplugin.deviceplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)

# Only the kubelet (root) may call us: Allocate hands out device nodes.
SOCKET_MODE = 0o600


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


class PluginServer:
    def __init__(self, socket_path: str, servicer: DevicePluginServicer, stop_margin: float = 0.5) -> None:
        self.socket_path = socket_path
        self.servicer = servicer
        self.stop_margin = stop_margin
        self._server: grpc.aio.Server | None = None
        self._identity: SocketId | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([device_plugin_handler(self.servicer)])
        try:
            bind_socket(server, self.socket_path)
            await server.start()
            os.chmod(self.socket_path, SOCKET_MODE)
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
        # A client that stopped reading keeps a write pending for ever, and gRPC then
        # never completes its shutdown: stop waiting shortly after the grace period.
        # (asyncio.wait, not wait_for: it never swallows a cancellation of ours.)
        stopping = asyncio.ensure_future(server.stop(grace))
        stopping.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, not raised
        done, _ = await asyncio.wait({stopping}, timeout=(grace or 0.0) + self.stop_margin)
        if not done:
            log.warning("gRPC server on %s did not stop in time: a client is not reading", self.socket_path)


def bind_socket(server: grpc.aio.Server, path: str) -> None:
    """Binds ``server`` to the unix socket ``path``, made with SOCKET_MODE from the start.

    A socket left by an earlier instance (killed before it could clean up) would make the
    bind fail; nobody else may own our socket's name. The socket gets the mode the umask
    leaves, so the umask is narrowed around the bind.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    umask = os.umask(0o777 & ~SOCKET_MODE)
    try:
        server.add_insecure_port(f"unix:{path}")
    finally:
        os.umask(umask)
