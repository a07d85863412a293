"""The idle baselines: a grpc.aio server with no code of ours, doing nothing.

    python -m bench.bare_grpc serve SOCKET    a server with one server-streaming method
                                              (x.Hold/Hold) that never sends
    python -m bench.bare_grpc hold SOCKET     a client that opens that stream and holds it
    python -m bench.bare_grpc plugin SOCKET RESOURCE UNITS
                                              the least a Python device plugin does: the
                                              DevicePlugin service on grpc.aio, one
                                              Register, the unit list sent once, answers
                                              with no checks, metrics, tracing or logs
    python -m bench.bare_grpc plugin-sync SOCKET RESOURCE UNITS THREADS
                                              the same on gRPC's synchronous server with
                                              a pool of THREADS threads

``serve`` alone is the bare server of the idle targets; ``serve`` with a ``hold`` client is the
same server while a peer holds a stream open, as the kubelet holds ListAndWatch.
``plugin`` is the Python floor of every figure next to squat/generic-device-plugin;
``plugin-sync`` tells what another gRPC server would change for Allocate throughput.
Each prints ``ready`` once serving (holding), then waits for SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

METHOD = "/x.Hold/Hold"


def _same(data: bytes) -> bytes:
    return data


async def _hold(request: bytes, context: Any) -> AsyncIterator[bytes]:
    await context.send_initial_metadata(())  # the client knows the stream is open
    await asyncio.Event().wait()  # never sends a message: the stream stays open and silent
    yield b""


async def serve(socket_path: str) -> None:
    server = grpc.aio.server()
    handlers = {
        "Hold": grpc.unary_stream_rpc_method_handler(_hold, request_deserializer=_same, response_serializer=_same)
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("x.Hold", handlers),))
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    print("ready", flush=True)
    await _until_signal()
    await server.stop(0)


async def hold(socket_path: str) -> None:
    options = [("grpc.default_authority", "localhost")]
    async with grpc.aio.insecure_channel(f"unix://{socket_path}", options=options) as channel:
        call = channel.unary_stream(METHOD, request_serializer=_same, response_deserializer=_same)(b"")
        await call.initial_metadata()
        print("ready", flush=True)
        await _until_signal()
        call.cancel()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class _Plugin:
    """The DevicePlugin answers of the bare plugin, with no checks: the same for both servers.

    Like ours by default, it does not advertise GetPreferredAllocation: the kubelet makes
    one Allocate per admission.
    """

    def __init__(self, resource: str, units: int) -> None:
        from ate_devplugin.api.v1beta1 import api_pb2 as pb  # the API's generated messages only

        self.pb = pb
        self.resource = resource
        self.options = pb.DevicePluginOptions(get_preferred_allocation_available=False)
        self.devices = pb.ListAndWatchResponse(devices=[pb.Device(ID=f"u-{n}", health="Healthy") for n in range(units)])
        self.container = pb.ContainerAllocateResponse(
            devices=[pb.DeviceSpec(container_path="/dev/kvm", host_path="/dev/kvm", permissions="rw")]
        )

    def preferred(self, request: Any, context: Any) -> Any:
        pb = self.pb
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(deviceIDs=c.available_deviceIDs[: c.allocation_size])
                for c in request.container_requests
            ]
        )

    def allocate(self, request: Any, context: Any) -> Any:
        return self.pb.AllocateResponse(container_responses=[self.container] * len(request.container_requests))

    def get_options(self, request: Any, context: Any) -> Any:
        return self.options

    def handler(self, wrap: Any, list_and_watch: Any) -> grpc.GenericRpcHandler[Any, Any]:
        """The service; ``wrap`` makes a unary answer what the server calls (async or not)."""
        pb = self.pb

        def unary(fn: Any, req: Any, resp: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                wrap(fn), request_deserializer=req.FromString, response_serializer=resp.SerializeToString
            )

        handlers = {
            "GetDevicePluginOptions": unary(self.get_options, pb.Empty, pb.DevicePluginOptions),
            "GetPreferredAllocation": unary(
                self.preferred, pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
            ),
            "Allocate": unary(self.allocate, pb.AllocateRequest, pb.AllocateResponse),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                list_and_watch,
                request_deserializer=pb.Empty.FromString,
                response_serializer=pb.ListAndWatchResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers)

    def register_request(self, socket_path: str) -> Any:
        return self.pb.RegisterRequest(
            version="v1beta1", endpoint=os.path.basename(socket_path), resource_name=self.resource, options=self.options
        )


def _kubelet(socket_path: str) -> str:
    return f"unix:{os.path.join(os.path.dirname(socket_path), 'kubelet.sock')}"


async def plugin(socket_path: str, resource: str, units: int) -> None:
    p = _Plugin(resource, units)

    async def list_and_watch(request: Any, context: Any) -> AsyncIterator[Any]:
        yield p.devices
        await asyncio.Event().wait()

    def wrap(fn: Any) -> Any:
        async def answer(request: Any, context: Any) -> Any:
            return fn(request, context)

        return answer

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((p.handler(wrap, list_and_watch),))
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    async with grpc.aio.insecure_channel(_kubelet(socket_path)) as channel:
        register = channel.unary_unary(
            "/v1beta1.Registration/Register",
            request_serializer=p.pb.RegisterRequest.SerializeToString,
            response_deserializer=p.pb.Empty.FromString,
        )
        await register(p.register_request(socket_path), timeout=10)
    print("ready", flush=True)
    await _until_signal()
    os.unlink(socket_path)
    await server.stop(0)


def plugin_sync(socket_path: str, resource: str, units: int, threads: int) -> None:
    """The same plugin on gRPC's synchronous server: every call on a pool thread, the
    ListAndWatch stream holding one of them for as long as it is open."""
    from concurrent.futures import ThreadPoolExecutor

    p = _Plugin(resource, units)
    stop = threading.Event()

    def list_and_watch(request: Any, context: Any) -> Iterator[Any]:
        yield p.devices
        stop.wait()

    server = grpc.server(ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers((p.handler(lambda fn: fn, list_and_watch),))
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    with grpc.insecure_channel(_kubelet(socket_path)) as channel:
        register = channel.unary_unary(
            "/v1beta1.Registration/Register",
            request_serializer=p.pb.RegisterRequest.SerializeToString,
            response_deserializer=p.pb.Empty.FromString,
        )
        register(p.register_request(socket_path), timeout=10)
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    stop.set()
    os.unlink(socket_path)
    server.stop(0)


def main() -> int:
    if sys.argv[1:2] == ["plugin"] and len(sys.argv) == 5:
        asyncio.run(plugin(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        return 0
    if sys.argv[1:2] == ["plugin-sync"] and len(sys.argv) == 6:
        # Blocked before any thread starts, so sigwait receives them.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        plugin_sync(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    if len(sys.argv) != 3 or sys.argv[1] not in ("serve", "hold"):
        print(
            "usage: python -m bench.bare_grpc serve|hold SOCKET | plugin SOCKET RESOURCE UNITS"
            " | plugin-sync SOCKET RESOURCE UNITS THREADS",
            file=sys.stderr,
        )
        return 2
    asyncio.run(serve(sys.argv[2]) if sys.argv[1] == "serve" else hold(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
