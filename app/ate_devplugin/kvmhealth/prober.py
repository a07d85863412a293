"""``ate-devplugin probe``: the prober. It runs where the device was granted to it (the chart's
prober pod requests the resource like any consumer), connects to the daemon's socket, says
hello with the devices it can probe, and answers each ``probe`` request with a verdict from
kvm/runner.py's worker (bounded there: a hung probe is ``timed-out``, never a hung prober).
It reconnects with backoff when the daemon is away, and exits 0 when told ``restart`` (its
device is stale: the kubelet starts it again with the host's current node).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

from ate_devplugin.kvm.runner import Prober
from ate_devplugin.kvmhealth.link import MAX_LINE, VERSION
from ate_devplugin.kvmhealth.monitor import Probes

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0


async def serve(
    socket_path: str,
    devices: Mapping[str, str],
    pod: str = "",
    prober: Probes | None = None,
    backoff_max_s: float = BACKOFF_MAX_S,
) -> int:
    """Serves the daemon until told to restart (returns 0) or cancelled."""
    prober = prober or Prober()
    backoff = BACKOFF_START_S
    try:
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_LINE)
            except OSError as exc:
                log.info("the daemon's socket %s is not there yet (%s): again in %.1fs", socket_path, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, backoff_max_s)
                continue
            backoff = BACKOFF_START_S
            log.info("connected to the daemon at %s", socket_path)
            try:
                if await _session(reader, writer, devices, pod, prober):
                    return 0
            except (ConnectionError, ValueError, asyncio.LimitOverrunError) as exc:
                log.warning("the connection to the daemon failed: %s", exc)
            finally:
                with contextlib.suppress(Exception):
                    writer.close()
            log.info("the daemon went away: reconnecting")
    finally:
        await prober.close()


async def _session(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    devices: Mapping[str, str],
    pod: str,
    prober: Probes,
) -> bool:
    """One connection; True when the daemon said restart."""
    _send(writer, {"hello": {"pod": pod, "devices": dict(devices)}})
    await writer.drain()
    while line := await reader.readline():
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("v") != VERSION:
            log.warning("the daemon sent a message of another version: ignored")
            continue
        if message.get("restart"):
            log.info("the daemon says the device is stale: exiting to be restarted")
            return True
        request = message.get("probe")
        if not isinstance(request, dict):
            continue
        resource = str(request.get("resource"))
        path = devices.get(resource)
        if path is None:
            log.warning("asked to probe %s, which this prober was not given", resource)
            continue
        result = await prober.probe(path, float(request.get("timeout_s", 5)))
        _send(writer, {"report": {"resource": resource, "result": result.to_json()}})
        await writer.drain()
        log.info("probed %s (%s): %s: %s", resource, path, result.reason, result.message)
    return False


def _send(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(json.dumps({"v": VERSION, **body}, separators=(",", ":")).encode() + b"\n")


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
