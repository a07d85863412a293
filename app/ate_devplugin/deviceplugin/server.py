"""One resource's DevicePlugin service on its own unix socket in the kubelet's socket directory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message_factory import GetMessageClass

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.deviceplugin.servicer import DevicePluginServicer, max_request_bytes
from ate_devplugin.host.sockets import UnixServer


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


def plugin_server(socket_path: str, servicer: DevicePluginServicer, stop_margin: float = 0.5) -> UnixServer:
    """The server refuses a request larger than the kubelet can send this resource
    (RESOURCE_EXHAUSTED), before it is decoded: every method's request is bounded by it."""
    handler = device_plugin_handler(servicer)
    options = [("grpc.max_receive_message_length", max_request_bytes(servicer.state.config))]
    return UnixServer(socket_path, lambda server: server.add_generic_rpc_handlers([handler]), stop_margin, options)
