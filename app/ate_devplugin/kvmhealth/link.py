"""The daemon's end of the prober's socket (``--kvm-probe socket``): the chart's daemon cannot
open host devices, so a prober pod that was granted the device probes it and reports here
(docs/kvm-health.md, "The socket protocol").

Newline-delimited JSON, ``v: 1``, each line at most ``MAX_LINE`` bytes. The prober says
``hello`` with the resources it can probe; the daemon asks ``probe`` (it owns the schedule:
kvmhealth/monitor.py) and the prober answers ``report`` with a ProbeResult; ``restart`` tells
it that its device is stale. One prober at a time: a new connection replaces the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

log = logging.getLogger(__name__)

VERSION = 1
MAX_LINE = 64 * 1024
REPLY_SLACK_S = 2.0  # beyond the probe's own timeout, for the prober's worker and the socket


class ProberLink:
    """Serves ``path``; ``probe(resource, timeout)`` asks the connected prober.

    ``on_connect`` is called when a prober says hello (the monitor then probes at once),
    ``on_gone`` once a prober has been away for ``grace_s`` (from the start, or from its
    disconnection), and again after each later connection that ends without a return."""

    def __init__(
        self,
        path: str,
        grace_s: float,
        on_connect: Callable[[], None] = lambda: None,
        on_gone: Callable[[float], None] = lambda away_s: None,
    ) -> None:
        self.path = path
        self.grace_s = grace_s
        self.on_connect = on_connect
        self.on_gone = on_gone
        self.hello: dict[str, Any] | None = None
        self._server: asyncio.Server | None = None
        self._inode = -1
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: dict[str, asyncio.Future[ProbeResult]] = {}
        self._gone_timer: asyncio.TimerHandle | None = None
        self._away_since = 0.0
        self._turn = asyncio.Lock()
        self.connections = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None and self.hello is not None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a previous daemon's
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        # The prober runs as another (non-root) user; only pods that mount the directory reach it.
        os.chmod(self.path, 0o666)
        self._inode = os.stat(self.path).st_ino
        self._away()

    async def close(self) -> None:
        if self._gone_timer is not None:
            self._gone_timer.cancel()
        if self._server is not None:
            self._server.close()
        if self._writer is not None:
            self._writer.close()
        # Only our own: in a rollout the next daemon pod may already serve the path (1.37+ overlap).
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)

    async def probe(self, resource: str, timeout: float) -> ProbeResult | None:
        """The prober's verdict on ``resource``; None when no prober is connected or it left
        before answering; ``timed-out`` when it answers nothing within ``timeout`` plus slack."""
        async with self._turn:
            writer = self._writer
            if writer is None or self.hello is None:
                return None
            loop = asyncio.get_running_loop()
            future: asyncio.Future[ProbeResult] = loop.create_future()
            self._waiting[resource] = future
            start = loop.time()
            try:
                _send(writer, {"probe": {"resource": resource, "timeout_s": timeout}})
                async with asyncio.timeout(timeout + REPLY_SLACK_S):
                    return await future
            except TimeoutError:
                message = f"the prober sent no report within {timeout + REPLY_SLACK_S:g}s"
                return ProbeResult(resource, Reason.TIMED_OUT, message, loop.time() - start)
            except ConnectionError:
                return None  # the prober left before answering: no verdict
            finally:
                self._waiting.pop(resource, None)

    def restart(self) -> None:
        """Tells the prober its device is stale (the host's node changed since it started)."""
        if self._writer is not None:
            log.info("asking the KVM prober to restart: the host's device node changed")
            _send(self._writer, {"restart": True})

    # --- the connection --------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = _message(await reader.readline())
            if first is None or not isinstance(first.get("hello"), dict):
                log.warning("a KVM prober connection without hello: closed")
                return
            if self._writer is not None:
                self._drop(self._writer)  # a rolled prober pod replaces the old one
            self._writer, self.hello = writer, first["hello"]
            self.connections += 1
            if self._gone_timer is not None:
                self._gone_timer.cancel()
                self._gone_timer = None
            said = {"pod": str(self.hello.get("pod", "")), "devices": self.hello.get("devices")}
            log.info("KVM prober connected", extra=said)
            self.on_connect()
            while line := await reader.readline():
                message = _message(line)
                report = message.get("report") if message else None
                if not isinstance(report, dict):
                    log.warning("the KVM prober sent what is not a report: ignored")
                    continue
                future = self._waiting.get(str(report.get("resource")))
                try:
                    result = ProbeResult.from_json(report["result"])
                except (KeyError, TypeError, ValueError):
                    bad = "the prober's report is not a probe result"
                    result = ProbeResult(str(report.get("resource")), Reason.PROBER_FAILED, bad, 0.0)
                if future is not None and not future.done():
                    future.set_result(result)
        except (ConnectionError, ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("the KVM prober's connection failed: %s", exc)
        finally:
            if self._writer is writer:
                self._writer = self.hello = None
                for future in self._waiting.values():
                    if not future.done():
                        future.set_exception(ConnectionError("the prober left"))
                log.warning("KVM prober disconnected")
                self._away()
            self._drop(writer)

    def _away(self) -> None:
        loop = asyncio.get_running_loop()
        self._away_since = loop.time()
        if self._gone_timer is not None:
            self._gone_timer.cancel()
        self._gone_timer = loop.call_later(self.grace_s, self._gone)

    def _gone(self) -> None:
        self._gone_timer = None
        if self._writer is None:
            self.on_gone(asyncio.get_running_loop().time() - self._away_since)

    @staticmethod
    def _drop(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            writer.close()


def _send(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(json.dumps({"v": VERSION, **body}, separators=(",", ":")).encode() + b"\n")


def _message(line: bytes) -> dict[str, Any] | None:
    """A v1 message, or None for an empty line (end), bad JSON or another version."""
    if not line:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        return None
    return data
