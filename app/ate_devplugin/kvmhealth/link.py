"""Socket mode (``--kvm-probe socket``): the daemon's end of the prober's socket. The chart's
daemon cannot open host devices, so a prober pod that was granted the device probes it
when asked here (kvm/wire.py is the protocol, kvm/prober.py the other end).

One prober at a time: a new one that says hello replaces the one before (a rolled pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from ate_devplugin.host.devices import DeviceNode
from ate_devplugin.kvm import wire
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

log = logging.getLogger(__name__)

REPLY_SLACK_S = 2.0  # beyond the probe's own timeout, for the prober's worker and the socket


class ProberLink:
    """Probes (kvmhealth/probes.py) by asking the connected prober.

    ``came`` is called when a prober says hello (then every resource is probed at once),
    ``gone`` once a prober has been away for ``grace_s`` (from the start, or from its
    disconnection), and again after each later connection that ends without a return."""

    waiting = "waiting for the prober"
    # A prober may never come (or be admitted): the verdict on the node before is not kept.
    follows_changes = False

    def __init__(self, path: str, grace_s: float) -> None:
        self.path = path
        self.grace_s = grace_s
        self.hello: wire.Hello | None = None  # the connected prober's
        self._came: Callable[[], None] = lambda: None
        self._gone: Callable[[float], None] = lambda away_s: None
        self._server: asyncio.Server | None = None
        self._inode = -1
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: dict[str, asyncio.Future[ProbeResult]] = {}
        self._gone_timer: asyncio.TimerHandle | None = None
        self._away_since = 0.0
        self._turn = asyncio.Lock()

    async def start(self, came: Callable[[], None], gone: Callable[[float], None]) -> None:
        self._came, self._gone = came, gone
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a previous daemon's
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=wire.MAX_LINE)
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

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
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
                writer.write(wire.encode(wire.ProbeRequest(resource, timeout)))
                async with asyncio.timeout(timeout + REPLY_SLACK_S):
                    return await future
            except TimeoutError:
                message = f"the prober sent no report within {timeout + REPLY_SLACK_S:g}s"
                return ProbeResult(resource, Reason.TIMED_OUT, message, loop.time() - start)
            except ConnectionError:
                return None  # the prober left before answering: no verdict
            finally:
                self._waiting.pop(resource, None)

    def stale(self) -> None:
        """Tells the prober its device is stale (the host's node changed since it started)."""
        if self._writer is not None:
            log.info("asking the KVM prober to restart: the host's device node changed")
            self._writer.write(wire.encode(wire.Restart()))

    # --- the connection --------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = _read(await reader.readline())
            if not isinstance(hello, wire.Hello):
                log.warning("a KVM prober connection without hello: closed")
                return
            if self._writer is not None:
                self._drop(self._writer)  # a rolled prober pod replaces the old one
            self._writer, self.hello = writer, hello
            if self._gone_timer is not None:
                self._gone_timer.cancel()
                self._gone_timer = None
            log.info("KVM prober connected", extra={"pod": hello.pod, "devices": dict(hello.devices)})
            self._came()
            while line := await reader.readline():
                self._take(line)
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

    def _take(self, line: bytes) -> None:
        """A line from the connected prober: a report answers its resource's request."""
        try:
            message = wire.decode(line)
        except wire.WireError as exc:
            if exc.resource is None:
                log.warning("the KVM prober sent what is not a message of this protocol (%s): ignored", exc)
                return
            bad = "the prober's report is not a probe result"
            message = wire.Report(exc.resource, ProbeResult(exc.resource, Reason.PROBER_FAILED, bad, 0.0))
        if not isinstance(message, wire.Report):
            log.warning("the KVM prober sent what is not a report: ignored")
            return
        future = self._waiting.get(message.resource)
        if future is not None and not future.done():
            future.set_result(message.result)

    def _away(self) -> None:
        loop = asyncio.get_running_loop()
        self._away_since = loop.time()
        if self._gone_timer is not None:
            self._gone_timer.cancel()
        self._gone_timer = loop.call_later(self.grace_s, self._timer)

    def _timer(self) -> None:
        self._gone_timer = None
        if self._writer is None:
            self._gone(asyncio.get_running_loop().time() - self._away_since)

    @staticmethod
    def _drop(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            writer.close()


def _read(line: bytes) -> wire.Message | None:
    """The first line's message; None at the end or when it is not one."""
    try:
        return wire.decode(line) if line else None
    except wire.WireError:
        return None
