"""Socket mode (``--kvm-probe socket``): the daemon's end of the prober's socket. The chart's
daemon cannot open host devices, so a prober pod that was granted the device probes it
when asked here (kvm/wire.py is the protocol, kvm/prober.py the other end).

Only the prober speaks for the device: a connection whose peer (SO_PEERCRED) is not the
prober's uid and gid is refused at once, before it can say anything, and so is one that
says no hello within ``HELLO_S``; each kind is counted and logged once while it lasts. Where
the prober runs as the daemon's own uid, the socket's directory is the daemon's alone
(0700): no other user even reaches the socket. One prober at a time: a new one that says
hello replaces the one before (a rolled pod); a refused peer never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable

from ate_devplugin.host.devices import DeviceNode
from ate_devplugin.kvm import wire
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import KvmMetrics

log = logging.getLogger(__name__)

REPLY_SLACK_S = 2.0  # beyond the probe's own timeout, for the prober's worker and the socket
HELLO_S = 5.0  # a connection that says no hello within this long is closed
_UCRED = struct.Struct("iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid


class ProberLink:
    """Probes (kvmhealth/probes.py) by asking the connected prober.

    ``came`` is called when a prober says hello (then every resource is probed at once),
    ``gone`` once a prober has been away for ``grace_s`` (from the start, or from its
    disconnection), and again after each later connection that ends without a return."""

    waiting = "waiting for the prober"
    # A prober may never come (or be admitted): the verdict on the node before is not kept.
    follows_changes = False

    def __init__(
        self, path: str, grace_s: float, prober: tuple[int, int], metrics: KvmMetrics, hello_s: float = HELLO_S
    ) -> None:
        """``prober``: the uid and gid the prober runs as, the only peer accepted."""
        self.path = path
        self.grace_s = grace_s
        self.hello_s = hello_s
        self.prober = prober
        self.metrics = metrics
        self._refusals = SaidOnce(remember=8)  # per kind of refusal, the peers said while they last
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
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        # The daemon cannot chown (no capability): a prober of its own uid gets a directory
        # only they reach; one of another uid reaches a socket anyone may connect to, and the
        # peer check alone tells it from the rest.
        ours = self.prober[0] == os.geteuid()
        os.chmod(directory, 0o700 if ours else 0o711)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=wire.MAX_LINE)
        os.chmod(self.path, 0o600 if ours else 0o666)
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

    def _refuse(self, why: str, peer: str, text: str) -> None:
        self.metrics.prober_refused.labels(why).inc()
        if self._refusals.new(peer, why):
            log.warning("refused a connection to the KVM prober's socket: %s", text, extra={"peer": peer})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid, gid, pid = _peer(writer)
            peer = f"uid {uid} gid {gid}"
            who = f"{peer} (pid {pid})" if pid else peer  # 0: a process of another pid namespace
            if (uid, gid) != self.prober:
                expected = f"uid {self.prober[0]} gid {self.prober[1]}"
                self._refuse("identity", peer, f"{who} is not the prober ({expected})")
                return
            try:
                async with asyncio.timeout(self.hello_s):
                    hello = _read(await reader.readline())
            except TimeoutError:
                hello = None
            if not isinstance(hello, wire.Hello):
                self._refuse("no-hello", peer, f"{who} said no hello within {self.hello_s:g}s: closed")
                return
            self._refusals.over("identity")
            self._refusals.over("no-hello")
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


def _peer(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    """The connected process's uid, gid and pid, as the kernel saw them at connect."""
    sock: socket.socket = writer.get_extra_info("socket")
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid, gid, pid
