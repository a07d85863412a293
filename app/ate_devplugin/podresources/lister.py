"""One List call to the kubelet's PodResources API, on a channel of its own, answered as bytes."""

from __future__ import annotations

import os

import grpc

from ate_devplugin.api.podresources.v1 import api_pb2 as pb

SERVICE = "v1.PodResourcesLister"
# gRPC's default, set explicitly: a node's real answer (a few hundred pods) is far smaller.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
_LIST = f"/{pb.DESCRIPTOR.services_by_name['PodResourcesLister'].full_name}/List"
_REASONS = {grpc.StatusCode.UNAVAILABLE: "unavailable", grpc.StatusCode.DEADLINE_EXCEEDED: "timeout"}


class PodResourcesError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of metrics.POD_RESOURCES_RESULTS, never "success"


async def list_pods(socket_path: str, timeout_s: float) -> bytes:
    """The answer's bytes (answer.read_holdings reads them, off the loop); raises PodResourcesError.

    A channel of its own per call: a kubelet restarted meanwhile is dialled afresh, and
    nothing stays connected between Lists (an open channel costs idle CPU)."""
    if not os.path.exists(socket_path):  # no kubelet (yet): no channel to set up in vain
        raise PodResourcesError("unavailable", f"List at {socket_path}: no such socket")
    # The kubelet's own clients send localhost, not the socket path, as :authority. A
    # subchannel of its own: gRPC would otherwise share one across channels, with the
    # reconnect backoff of a socket that was gone.
    options = [
        ("grpc.default_authority", "localhost"),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
    ]
    async with grpc.aio.insecure_channel(f"unix://{socket_path}", options=options) as channel:
        list_call = channel.unary_unary(
            _LIST, request_serializer=pb.ListPodResourcesRequest.SerializeToString, response_deserializer=None
        )
        try:
            response: bytes = await list_call(pb.ListPodResourcesRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise PodResourcesError(
                _REASONS.get(code, "error"), f"List at {socket_path}: {code.name}: {exc.details()}"
            ) from exc
    return response
