"""HTTP endpoints: /metrics, /healthz (the loop answers, events are handled), /readyz (registered).

Served from a thread so that a wedged event loop is reported (503) instead of silently
taking the probes down with it; readiness itself is computed on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

log = logging.getLogger(__name__)

LOOP_DEADLINE_S = 2.0
# A client that connects and never sends loses its thread after this long.
CLIENT_TIMEOUT_S = 10.0


class HttpServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        loop: asyncio.AbstractEventLoop,
        readiness: Callable[[], tuple[bool, str]],
        liveness: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
    ) -> None:
        server_loop = loop

        async def ask(probe: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
            return probe()

        def ask_loop(probe: Callable[[], tuple[bool, str]]) -> tuple[bool, str] | None:
            """The probe's answer as the loop sees it; None when the loop does not answer in time."""
            future = asyncio.run_coroutine_threadsafe(ask(probe), server_loop)
            try:
                return future.result(LOOP_DEADLINE_S)
            except FutureTimeout:
                future.cancel()
                return None

        class Handler(MetricsHandler):
            timeout = CLIENT_TIMEOUT_S

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    super().do_GET()
                elif path in ("/healthz", "/readyz"):
                    answer = ask_loop(liveness if path == "/healthz" else readiness)
                    if answer is None:
                        self._text(503, f"event loop did not answer within {LOOP_DEADLINE_S}s\n")
                    else:
                        good, reason = answer
                        self._text(200 if good else 503, reason + "\n")
                else:
                    self._text(404, "not found; try /metrics, /healthz or /readyz\n")

            def _text(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base class's name
                pass

        Handler.registry = registry
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    def _serve(self) -> None:
        # A long poll interval: nothing to check between requests, so no idle wake-ups.
        self._server.serve_forever(poll_interval=3600)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.server_close()
