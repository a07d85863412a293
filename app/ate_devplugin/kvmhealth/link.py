"""Socket mode (``--kvm-probe socket``): the daemon's end of the prober's socket. The chart's
daemon cannot open host devices, so a prober pod that was granted the device probes it
when asked here (kvm/wire.py is the protocol, kvm/prober.py the other end).

Only the prober speaks for the device: a connection whose peer (SO_PEERCRED) is not the
prober's uid and gid is refused at once, before it can say anything, and so is one that
says no hello within ``HELLO_S``, or a hello of another protocol version. Every line is
checked (wire.decode) before it is believed; a report that fails is no verdict, nor is one
that answers another request than the one asked (a late answer). Each kind of refusal is
counted and logged once while it lasts. The socket's directory is the daemon's alone
(host/sockdir.py): 0700 where the prober runs as the daemon's uid, as the chart's does.

One prober at a time: the one heard keeps it while it is connected; a second one (a pod
rolled with overlap, a second release's prober on the same socket) is told to wait and
is held, unheard, until the first goes, then heard at once. Nobody is displaced, so no
prober reconnects in a loop and no request is written to a connection about to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ate_devplugin.host.devices import DeviceNode
from ate_devplugin.host.sockdir import own_directory
from ate_devplugin.kvm import wire
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvmhealth.probes import Change, Pending
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import KvmMetrics

log = logging.getLogger(__name__)

REPLY_SLACK_S = 2.0  # beyond the probe's own timeout, for the prober's worker and the socket
HELLO_S = 5.0  # a connection that says no hello within this long is closed
QUIET_S = 60.0  # a kind of refusal none came of for this long is over: the next is logged
MAX_WAITING = 4  # probers held in line behind the one heard; more are refused (busy)
_UCRED = struct.Struct("iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid


@dataclass(eq=False)
class _Prober:
    """A connection that said hello: heard (the current one) or waiting its turn."""

    writer: asyncio.StreamWriter
    hello: wire.Hello
    peer: str  # "uid U gid G": what refusals of it are keyed by
    who: str  # the peer, its pid and pod: for the log


@dataclass(eq=False)
class _Asked:
    """The request in flight (one at a time): its answer is the report of this id."""

    request: int
    resource: str
    prober: _Prober
    answer: asyncio.Future[ProbeResult | None]


class ProberLink:
    """Probes (kvmhealth/probes.py) by asking the connected prober.

    ``changed`` is told ANSWERING when a prober is heard (then every resource is probed at
    once), WITHDRAWN once none has been heard for ``grace_s`` (from the start, or from its
    disconnection), and again after each later connection that ends without a return. A node
    with no verdict is ``unverified`` while a prober may answer, ``prober-gone`` past the grace."""

    # A prober may never come (or be admitted): the verdict on the node before is not kept.
    WAITING = Pending(said="waiting for the prober")

    def __init__(
        self,
        path: str,
        grace_s: float,
        prober: tuple[int, int],
        metrics: KvmMetrics,
        hello_s: float = HELLO_S,
        quiet_s: float = QUIET_S,
    ) -> None:
        """``prober``: the uid and gid the prober runs as, the only peer accepted."""
        self.path = path
        self.grace_s = grace_s
        self.hello_s = hello_s
        self.quiet_s = quiet_s
        self.prober = prober
        self.metrics = metrics
        self.connections = 0  # accepted since start: what a reconnect storm would show
        self._refusals = SaidOnce(remember=8)  # per kind of refusal, the peers said while they last
        self._refused_at: dict[str, float] = {}  # per kind, when the last came
        self._changed: Callable[[Change], None] = lambda change: None
        self._server: asyncio.Server | None = None
        self._inode = -1
        self._heard: _Prober | None = None
        self._line: list[_Prober] = []  # waiting their turn, first come first
        self._asked: _Asked | None = None
        self._ids = itertools.count(1)
        self._gone_timer: asyncio.TimerHandle | None = None
        self._away_since = 0.0
        self._away_s: float | None = None  # how long none was heard, once past the grace
        self._turn = asyncio.Lock()

    @property
    def hello(self) -> wire.Hello | None:
        """The hello of the prober heard; None while there is none."""
        return self._heard.hello if self._heard else None

    def pending(self) -> Pending:
        if self._away_s is None:
            return self.WAITING
        return Pending("prober-gone", f"no prober for {self._away_s:.0f}s")

    async def start(self, changed: Callable[[Change], None]) -> None:
        """Raises OSError (host/sockdir.SocketDirError: one line naming what to remove)."""
        self._changed = changed
        directory = os.path.dirname(self.path) or "."
        # The daemon cannot chown (no capability): a prober of its own uid gets a directory
        # only they reach; one of another uid reaches a socket anyone may connect to, and the
        # peer check alone tells it from the rest.
        ours = self.prober[0] == os.geteuid()
        if own_directory(directory, 0o700 if ours else 0o711):
            log.info("set the mode of the KVM prober's socket directory %s", directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a previous daemon's, in a directory no one else writes to
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=wire.MAX_LINE)
        os.chmod(self.path, 0o600 if ours else 0o666)
        self._inode = os.stat(self.path).st_ino
        self._away()

    async def close(self) -> None:
        if self._gone_timer is not None:
            self._gone_timer.cancel()
        if self._server is not None:
            self._server.close()
        for prober in [*self._line, *([self._heard] if self._heard else [])]:
            _drop(prober.writer)
        # Only our own: in a rollout the next daemon pod may already serve the path (1.37+ overlap).
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        """The prober's verdict on ``resource``; None when no prober is heard, it left before
        answering or its report could not be believed; ``timed-out`` when it answers nothing
        within ``timeout`` plus slack."""
        async with self._turn:
            prober = self._heard
            if prober is None:
                return None
            loop = asyncio.get_running_loop()
            asked = _Asked(next(self._ids), resource, prober, loop.create_future())
            self._asked = asked
            start = loop.time()
            try:
                prober.writer.write(wire.encode(wire.ProbeRequest(resource, timeout, asked.request)))
                async with asyncio.timeout(timeout + REPLY_SLACK_S):
                    return await asked.answer
            except TimeoutError:
                if self._line and self._heard is prober:
                    # Its worker bounds the probe: a prober silent past that is stuck, and one waits.
                    log.warning("the KVM prober %s answers nothing: the next one in line is heard", prober.who)
                    _drop(prober.writer)
                detail = f"the prober sent no report within {timeout + REPLY_SLACK_S:g}s"
                return ProbeResult(node.host_path, Reason.TIMED_OUT, detail, loop.time() - start)
            except ConnectionError:
                return None  # the prober left before answering: no verdict
            finally:
                self._asked = None

    def stale(self) -> None:
        """Tells the prober its device is stale (the host's node changed since it started)."""
        if self._heard is not None:
            log.info("asking the KVM prober to restart: the host's device node changed")
            self._heard.writer.write(wire.encode(wire.Restart()))

    # --- the connections -------------------------------------------------------------

    def _refuse(self, why: str, peer: str, text: str, what: str = "") -> None:
        """Counts a refusal; logs it unless the same (``peer``, ``what``) was said while this
        kind lasts (none came of it for ``quiet_s``)."""
        self.metrics.prober_refused.labels(why).inc()
        now = asyncio.get_running_loop().time()
        if now - self._refused_at.get(why, -self.quiet_s) >= self.quiet_s:
            self._refusals.over(why)
        self._refused_at[why] = now
        if self._refusals.new(f"{peer} {what}", why):
            log.warning("refused %s", text, extra={"peer": peer, "refusal": why})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        prober: _Prober | None = None
        try:
            prober = await self._admit(reader, writer)
            if prober is None:
                return
            while line := await reader.readline():
                if prober is self._heard:
                    self._take(prober, line)
                # else: waiting, unheard; it has nothing to say before its turn
        except ConnectionError:
            pass  # gone: as at the end of its lines
        except (asyncio.LimitOverrunError, ValueError) as exc:  # a line past the limit (StreamReader)
            if prober is not None:
                self._refuse("bad-message", prober.peer, f"the KVM prober {prober.who}'s line: {exc}", "line")
        finally:
            _drop(writer)
            if prober is not None:
                self._left(prober)

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Prober | None:
        """The connection's prober once it said hello, heard or in line; None when refused."""
        uid, gid, pid = _peer(writer)
        peer = f"uid {uid} gid {gid}"
        who = f"{peer} (pid {pid})" if pid else peer  # 0: a process of another pid namespace
        connection = f"a connection to the KVM prober's socket: {who}"
        if (uid, gid) != self.prober:
            expected = f"uid {self.prober[0]} gid {self.prober[1]}"
            self._refuse("identity", peer, f"{connection} is not the prober ({expected})")
            return None
        try:
            async with asyncio.timeout(self.hello_s):
                line = await reader.readline()
            hello = wire.decode(line) if line else None
        except TimeoutError:
            hello = None
        except wire.VersionError as exc:
            text = f"{connection} speaks protocol version {exc.version}; this daemon speaks {wire.VERSION}"
            self._refuse("version", peer, text, str(exc.version))
            return None
        except (ValueError, asyncio.LimitOverrunError) as exc:  # a WireError, or a line past the limit
            self._refuse("bad-message", peer, f"{connection}: its hello: {exc}", getattr(exc, "field", "line"))
            return None
        if not isinstance(hello, wire.Hello):
            self._refuse("no-hello", peer, f"{connection} said no hello within {self.hello_s:g}s")
            return None
        self.connections += 1
        prober = _Prober(writer, hello, peer, f"{who}, pod {hello.pod or '?'}")
        if self._heard is None:
            self._hear(prober)
        elif len(self._line) < MAX_WAITING:
            self._line.append(prober)
            writer.write(wire.encode(wire.Wait(f"the daemon hears the prober {self._heard.who} until it leaves")))
            if self._refusals.new(prober.hello.pod, "waiting"):
                log.warning(
                    "a second KVM prober (%s) waits its turn: the prober %s is heard", prober.who, self._heard.who
                )
        else:
            self._refuse("busy", peer, f"the KVM prober {who}: {MAX_WAITING} wait already")
            return None
        return prober

    def _hear(self, prober: _Prober) -> None:
        self._heard = prober
        if self._gone_timer is not None:
            self._gone_timer.cancel()
            self._gone_timer = None
        extra = {"pod": prober.hello.pod, "devices": dict(prober.hello.devices), "connections": self.connections}
        log.info("KVM prober connected", extra=extra)  # connections since start: a storm would show
        self._away_s = None
        self._changed(Change.ANSWERING)

    def _left(self, prober: _Prober) -> None:
        if prober in self._line:
            self._line.remove(prober)
            return
        if prober is not self._heard:
            return
        self._heard = None
        if self._asked is not None and not self._asked.answer.done():
            self._asked.answer.set_result(None)  # no verdict: the next prober is asked again
        log.warning("KVM prober disconnected", extra={"pod": prober.hello.pod})
        if self._line:
            self._refusals.over("waiting")
            self._hear(self._line.pop(0))
        else:
            self._away()

    def _take(self, prober: _Prober, line: bytes) -> None:
        """A line from the prober heard: a report answers the request in flight if it is its."""
        asked = self._asked
        try:
            message = wire.decode(line)
        except wire.WireError as exc:
            self._refuse("bad-message", prober.peer, f"the KVM prober {prober.who}'s message: {exc}", exc.field)
            if asked is not None and exc.request in (None, asked.request) and exc.resource in (None, asked.resource):
                asked.answer.set_result(None)  # its answer cannot be read: no verdict, the last holds
            return
        if not isinstance(message, wire.Report):
            what = type(message).__name__.lower()
            self._refuse("bad-message", prober.peer, f"the KVM prober {prober.who} sent a {what}, not a report", what)
            return
        # A prober of 0.1.0 echoes no id: its report answers the request of its resource.
        current = asked is not None and message.resource == asked.resource
        if prober.hello.ids:
            current = current and asked is not None and message.request == asked.request
        if asked is None or not current or asked.answer.done():
            text = f"the KVM prober {prober.who}'s report on {message.resource} (request {message.request}): "
            text += f"request {asked.request} on {asked.resource} is in flight" if asked else "none is in flight"
            self._refuse("late", prober.peer, text, message.resource)
            return
        self._refusals.over("bad-message")
        asked.answer.set_result(message.result)

    def _away(self) -> None:
        loop = asyncio.get_running_loop()
        self._away_since = loop.time()
        if self._gone_timer is not None:
            self._gone_timer.cancel()
        self._gone_timer = loop.call_later(self.grace_s, self._timer)

    def _timer(self) -> None:
        self._gone_timer = None
        if self._heard is None:
            self._away_s = away_s = asyncio.get_running_loop().time() - self._away_since
            log.warning("no KVM prober for %.0fs: the devices are judged by existence", away_s)
            self._changed(Change.WITHDRAWN)


def _drop(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


def _peer(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    """The connected process's uid, gid and pid, as the kernel saw them at connect."""
    sock: socket.socket = writer.get_extra_info("socket")
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid, gid, pid
