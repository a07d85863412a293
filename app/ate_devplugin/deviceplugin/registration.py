"""Registering a resource with the kubelet."""

from __future__ import annotations

import asyncio

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from ate_devplugin.observability.tracing import rpc_span, set_rpc_status

API_VERSION = "v1beta1"

_REASONS = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    # The kubelet reports validation and duplicate-connection failures as plain errors.
    grpc.StatusCode.UNKNOWN: "rejected",
    grpc.StatusCode.INVALID_ARGUMENT: "rejected",
    grpc.StatusCode.ALREADY_EXISTS: "rejected",
    grpc.StatusCode.FAILED_PRECONDITION: "rejected",
}


class RegistrationError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of metrics.REGISTRATION_RESULTS, never "success"


async def register(
    kubelet_socket: str,
    endpoint: str,
    resource_name: str,
    options: pb.DevicePluginOptions,
    tracer: Tracer,
    *,
    cause: Context | None = None,
    timeout: float,
) -> None:
    """Registers, raising RegistrationError; ``cause`` parents the span (e.g. a kubelet restart)."""
    request = pb.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=options)
    # Python gRPC would send the socket path as :authority; the kubelet's peers send localhost.
    # A subchannel of its own: from gRPC's shared pool, a new channel to the same path could
    # take up the connection still being made to the kubelet socket this one replaced,
    # which never answers, instead of connecting to the new one.
    channel_options = [("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1)]
    with rpc_span(tracer, "v1beta1.Registration", "Register", SpanKind.CLIENT, cause) as span:
        span.set_attribute("ate_devplugin.resource_name", resource_name)
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}", options=channel_options) as channel:
            try:
                stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]  # generated code is unannotated
                await stub.Register(request, timeout=timeout)
            except asyncio.CancelledError:  # moot: a new kubelet came, or the daemon stops
                set_rpc_status(span, grpc.StatusCode.CANCELLED.value[0], "CANCELLED", "the attempt was abandoned")
                raise
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                set_rpc_status(span, code.value[0], code.name, exc.details() or "")
                raise RegistrationError(
                    _REASONS.get(code, "error"),
                    f"register {resource_name} at {kubelet_socket}: {code.name}: {exc.details()}",
                ) from exc
        set_rpc_status(span, grpc.StatusCode.OK.value[0], "OK")
