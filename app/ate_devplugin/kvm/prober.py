"""``ate-devplugin probe``: the prober. It runs where the device was granted to it (the chart's
prober pod), connects to the daemon's socket, says hello with the devices it can probe, and
answers each probe request with a verdict from a :class:`~ate_devplugin.kvm.runner.ProbeRunner`
(bounded there: a hung probe is ``timed-out``, never a hung prober). It reconnects with
backoff while the daemon is away, and exits 0 when told to restart (its device is stale:
the kubelet starts it again with the host's current node). It speaks kvm/wire.py and loads
nothing of the daemon. A connection that ends before the daemon said anything (refused: a
prober is already heard, or this one is not believed) is retried with backoff, never at once;
one told to wait stays connected until the daemon hears it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping

from ate_devplugin.kvm import wire
from ate_devplugin.kvm.runner import ProbeRunner, Runner
from ate_devplugin.tasks import Backoff

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0


async def serve(
    socket_path: str,
    devices: Mapping[str, str],
    pod: str = "",
    runner: Runner | None = None,
    backoff_max_s: float = BACKOFF_MAX_S,
) -> int:
    """Serves the daemon until told to restart (returns 0) or cancelled."""
    runner = runner or ProbeRunner()
    backoff = Backoff(min(BACKOFF_START_S, backoff_max_s), backoff_max_s)
    try:
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(socket_path, limit=wire.MAX_LINE)
            except OSError as exc:
                delay = backoff.next()
                log.info("the daemon's socket %s is not there yet (%s): again in %.1fs", socket_path, exc, delay)
                await asyncio.sleep(delay)
                continue
            log.info("connected to the daemon at %s", socket_path)
            session = _Session(wire.Hello(pod, dict(devices), ids=True), runner, backoff)
            try:
                if await session.run(reader, writer):
                    return 0
            except (ConnectionError, ValueError, asyncio.LimitOverrunError) as exc:
                log.warning("the connection to the daemon failed: %s", exc)
            finally:
                with contextlib.suppress(Exception):
                    writer.close()
            if session.heard:
                log.info("the daemon went away: reconnecting")
                continue
            delay = backoff.next()
            log.info("the daemon closed the connection without a word (refused?): again in %.1fs", delay)
            await asyncio.sleep(delay)
    finally:
        await runner.close()


class _Session:
    """One connection. ``heard``: the daemon said something of this protocol (then the
    backoff starts again: it was there and listening)."""

    def __init__(self, hello: wire.Hello, runner: Runner, backoff: Backoff) -> None:
        self.hello, self.runner, self.backoff = hello, runner, backoff
        self.heard = False

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """True when the daemon said restart."""
        writer.write(wire.encode(self.hello))
        await writer.drain()
        while line := await reader.readline():
            try:
                message = wire.decode(line)
            except wire.WireError as exc:
                log.warning("the daemon sent what is not a message of this protocol (%s): ignored", exc)
                continue
            if not self.heard:
                self.heard = True
                self.backoff.reset()
            if isinstance(message, wire.Restart):
                log.info("the daemon says the device is stale: exiting to be restarted")
                return True
            if isinstance(message, wire.Wait):
                log.info("waiting for the daemon to hear this prober: %s", message.reason)
                continue
            if not isinstance(message, wire.ProbeRequest):
                log.warning("the daemon sent a %s, which only a prober sends: ignored", type(message).__name__)
                continue
            path = self.hello.devices.get(message.resource)
            if path is None:
                log.warning("asked to probe %s, which this prober was not given", message.resource)
                continue
            result = await self.runner.probe(path, message.timeout_s)
            writer.write(wire.encode(wire.Report(message.resource, result, message.request)))
            await writer.drain()
            log.info("probed %s (%s): %s: %s", message.resource, path, result.reason, result.message)
        return False


def parse_devices(given: list[str]) -> dict[str, str]:
    """``RESOURCE=PATH`` pairs; raises ValueError naming the bad one."""
    devices = {}
    for item in given:
        resource, sep, path = item.partition("=")
        if not sep or not resource or not path.startswith("/"):
            raise ValueError(f"--device {item!r}: give RESOURCE=/absolute/path")
        devices[resource] = path
    return devices


def run(socket_path: str, devices: Mapping[str, str]) -> int:
    """The command: serves until told to restart or stopped (SIGTERM, SIGINT: exit 0)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pod = f"{os.environ.get('K8S_NAMESPACE_NAME', '')}/{os.environ.get('K8S_POD_NAME', '')}".strip("/")

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await serve(socket_path, devices, pod)
        except asyncio.CancelledError:
            return 0

    return asyncio.run(main())
