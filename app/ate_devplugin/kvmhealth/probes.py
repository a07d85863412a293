"""Who probes the devices for the daemon: one interface, two implementations.

* :class:`LocalProbes` (``--kvm-probe local``): the daemon can open the device (the kubelet
  bench, ``make demo``) and probes it itself, in kvm/runner.py's child process.
* link.ProberLink (``--kvm-probe socket``): a prober pod granted the device probes it when
  asked over a unix socket (the chart's daemon cannot open host devices).
* :class:`NoProbes` (``--kvm-probe off``): nobody probes; a node that is not KVM's 10:232
  still fails, which needs no open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ate_devplugin.host.devices import DeviceNode, EscapesRootError, in_root, resolve_in_root
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.runner import ProbeRunner, Runner


class Probes(Protocol):
    # What /readyz says of a present node with no verdict yet.
    waiting: str
    # Whether a new node's probe follows at once: the verdict on the node before then holds
    # until it comes; otherwise that verdict goes with its node.
    follows_changes: bool

    async def start(self, came: Callable[[], None], gone: Callable[[float], None]) -> None:
        """Begins; ``came`` when a prober arrives, ``gone`` with how long it has been away
        once that is too long (neither is ever called where the daemon probes itself)."""

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        """The verdict on ``node`` (bounded by ``timeout``); None when there is none to be had now."""

    def stale(self) -> None:
        """A verdict came of another node than the host's now."""

    async def close(self) -> None: ...


class LocalProbes:
    waiting = "no verdict yet"
    follows_changes = True

    def __init__(self, device_root: str, runner: Runner | None = None) -> None:
        self.device_root = device_root
        self.runner = runner or ProbeRunner()

    async def start(self, came: Callable[[], None], gone: Callable[[float], None]) -> None:
        pass  # the daemon is its own prober: it never comes or goes

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        root = self.device_root
        try:
            # Gone since (None): probed where it was, the verdict says so until its discovery.
            path = resolve_in_root(root, node.host_path) or in_root(root, node.host_path)
        except EscapesRootError:
            return None  # a symlink swapped in since: its discovery follows, and ignores it
        return await self.runner.probe(path, timeout)

    def stale(self) -> None:
        pass  # the next discovery's node is probed afresh

    async def close(self) -> None:
        await self.runner.close()


class NoProbes:
    waiting = ""  # nothing will come: /readyz says nothing of it
    follows_changes = False  # a verdict of the node before (not 10:232) goes with it

    async def start(self, came: Callable[[], None], gone: Callable[[float], None]) -> None:
        pass

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        return None

    def stale(self) -> None:
        pass

    async def close(self) -> None:
        pass
