"""Loopback networking for tests: a free TCP port, and HTTP GET that never uses a proxy."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Mapping

# Loopback only: never route a test's requests through a proxy from the environment.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 10) -> tuple[int, bytes]:
    """The status and body of a GET; an HTTP error status is an answer, not an exception.
    Raises OSError when nothing answers."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with LOOPBACK.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
