"""HTTP endpoints: /metrics, /healthz (the loop answers, events are handled), /readyz (registered).

Served by an event loop of its own, in a thread, so that a wedged daemon loop is reported
(503) instead of silently taking the probes down with it; readiness itself is computed on
the daemon's loop. That one loop holds every client connection, so a slow or silent client
costs a socket until its deadline, never a thread; /metrics is rendered by a small fixed
pool of threads. Responses close the connection (as HTTP/1.0 did here before).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import resource
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

log = logging.getLogger(__name__)

LOOP_DEADLINE_S = 2.0
# A whole exchange, from accept to the last byte written (Prometheus' default scrape timeout).
REQUEST_DEADLINE_S = 10.0
# Connections the kernel queues for us: a burst of scrapes and probes waits there instead
# of having its SYNs dropped (a dropped SYN costs the client 1 s, then 3 s, then 7 s).
BACKLOG = 1024
# Threads rendering /metrics: the only threads the endpoint adds besides its loop's.
WORKERS = 2
# Open connections at most (fewer when the file descriptor limit is low): past it the
# oldest is dropped, so a flood can exhaust neither descriptors nor memory, and a probe
# always gets in.
MAX_CLIENTS = 1024
MAX_HEAD_BYTES = 8192

Response = tuple[int, list[tuple[str, str]], bytes]


class _BadRequestError(Exception):
    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class HttpServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        loop: asyncio.AbstractEventLoop,
        readiness: Callable[[], tuple[bool, str]],
        liveness: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
        on_death: Callable[[BaseException], None] = lambda error: None,
    ) -> None:
        """``on_death`` hears, on the endpoint's thread, of an error that ended it (tasks.Guard.for_thread)."""
        self._registry = registry
        self._daemon_loop = loop
        self._readiness = readiness
        self._liveness = liveness
        self._on_death = on_death
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.port: int = self._sock.getsockname()[1]
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._max_clients = (
            MAX_CLIENTS if soft_fd_limit == resource.RLIM_INFINITY else max(16, min(MAX_CLIENTS, soft_fd_limit // 2))
        )
        # Open connections in accept order, each with why it was dropped (None: not dropped).
        self._clients: dict[asyncio.StreamWriter, str | None] = {}
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="http-metrics")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, deadline_s: float = LOOP_DEADLINE_S) -> None:
        """Stops the endpoint, waiting at most ``deadline_s`` for its thread (a daemon thread:
        one still busy then does not hold the exit)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(deadline_s)
        elif self._thread.ident is None:  # never started
            self._loop.close()
        self._sock.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # told, not raised: nobody would hear it on this thread
            self._on_death(exc)

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(
            asyncio.start_server(self._serve_client, sock=self._sock, backlog=BACKLOG, limit=MAX_HEAD_BYTES)
        )
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients[writer] = None
        if len(self._clients) > self._max_clients:
            oldest = next(iter(self._clients))
            self._clients[oldest] = f"dropped for a newer client ({self._max_clients} connections open)"
            oldest.transport.abort()
        problem: str | None = None
        try:
            async with asyncio.timeout(REQUEST_DEADLINE_S):
                try:
                    request = await _read_head(reader)
                    if request is None:
                        return  # connected and closed without a byte: a TCP check
                    response = await self._answer(*request)
                except _BadRequestError as exc:
                    problem = str(exc)
                    response = _text(exc.status, f"{exc}\n")
                writer.write(_encode(response))
                await writer.drain()
                writer.close()
                await writer.wait_closed()  # every byte handed to the kernel, within the deadline
        except asyncio.CancelledError:
            # The endpoint is closing. Not raised on: Python 3.11's stream callback would
            # log a cancelled client task as an error with a traceback.
            writer.transport.abort()
        except TimeoutError:
            problem = f"no complete exchange within {REQUEST_DEADLINE_S:g}s"
        except asyncio.IncompleteReadError:
            problem = "closed by the client before a complete request"
        except ConnectionResetError:
            problem = "connection reset by the client"
        except OSError as exc:
            problem = f"connection lost: {exc}"
        finally:
            problem = self._clients.pop(writer, None) or problem
            if problem:
                log.info("http client dropped", extra={"client": _peer(writer), "reason": problem})
                writer.transport.abort()
            else:
                writer.close()

    async def _answer(self, method: str, target: str, headers: dict[str, str]) -> Response:
        if method != "GET":
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, "only GET\n", [("Allow", "GET")])
        url = urlsplit(target)
        if url.path == "/metrics":
            names = parse_qs(url.query).get("name[]")
            accept, encoding = headers.get("accept", ""), headers.get("accept-encoding", "")
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._workers, self._render, accept, encoding, names)
        if url.path in ("/healthz", "/readyz"):
            answer = await self._ask_daemon_loop(self._liveness if url.path == "/healthz" else self._readiness)
            if answer is None:
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"event loop did not answer within {LOOP_DEADLINE_S}s\n")
            good, reason = answer
            return _text(HTTPStatus.OK if good else HTTPStatus.SERVICE_UNAVAILABLE, reason + "\n")
        return _text(HTTPStatus.NOT_FOUND, "not found; try /metrics, /healthz or /readyz\n")

    async def _ask_daemon_loop(self, probe: Callable[[], tuple[bool, str]]) -> tuple[bool, str] | None:
        """A probe's answer as the daemon's loop sees it; None when that loop does not answer in time."""

        async def ask() -> tuple[bool, str]:
            return probe()

        asking = ask()
        try:
            future = asyncio.run_coroutine_threadsafe(asking, self._daemon_loop)
        except RuntimeError:  # that loop is closed: the daemon is going away
            asking.close()
            return None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), LOOP_DEADLINE_S)
        except TimeoutError:
            return None

    def _render(self, accept: str, accept_encoding: str, names: list[str] | None) -> Response:
        encoder, content_type = choose_encoder(accept)
        registry = self._registry.restricted_registry(names) if names else self._registry
        body = encoder(registry)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(accept_encoding):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        return HTTPStatus.OK, headers, body


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    """Method, target and headers (names lower-cased); None when the client sent nothing."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError:
        raise _BadRequestError(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes"
        ) from None
    request_line, *lines = raw.decode("latin-1").split("\r\n")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequestError(HTTPStatus.BAD_REQUEST, "malformed request line")
    headers: dict[str, str] = {}
    for line in filter(None, lines):
        name, colon, value = line.partition(":")
        if not colon:
            raise _BadRequestError(HTTPStatus.BAD_REQUEST, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def _text(status: int, body: str, headers: list[tuple[str, str]] | None = None) -> Response:
    return status, [("Content-Type", "text/plain; charset=utf-8"), *(headers or [])], body.encode()


def _encode(response: Response) -> bytes:
    status, headers, body = response
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    head += [f"{name}: {value}" for name, value in headers]
    head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = f"[{peer[0]}]" if ":" in str(peer[0]) else str(peer[0])
        return f"{host}:{peer[1]}"
    return str(peer)
