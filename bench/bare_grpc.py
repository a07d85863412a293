"""The idle baselines: a grpc.aio server with no code of ours, doing nothing.

    python -m bench.bare_grpc serve SOCKET    a server with one server-streaming method
                                              (x.Hold/Hold) that never sends
    python -m bench.bare_grpc hold SOCKET     a client that opens that stream and holds it

``serve`` alone is the bare server of issue 5; ``serve`` with a ``hold`` client is the
same server while a peer holds a stream open, as the kubelet holds ListAndWatch. Each
prints ``ready`` once serving (holding), then waits for SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
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


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("serve", "hold"):
        print("usage: python -m bench.bare_grpc serve|hold SOCKET", file=sys.stderr)
        return 2
    asyncio.run(serve(sys.argv[2]) if sys.argv[1] == "serve" else hold(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
