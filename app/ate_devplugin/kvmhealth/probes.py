"""Who probes the devices for the daemon: one interface, three implementations.

* :class:`LocalProbes` (``--kvm-probe local``): the daemon can open the device (the kubelet
  bench, ``make demo``) and probes it itself, in kvm/runner.py's child process.
* link.ProberLink (``--kvm-probe socket``): a prober pod granted the device probes it when
  asked over a unix socket (the chart's daemon cannot open host devices).
* :class:`NoProbes` (``--kvm-probe off``): nobody probes; a node that is not KVM's 10:232
  still fails, which needs no open.

Each says what holds of a node it has no verdict on (:class:`Pending`), and tells when that
changes (:class:`Change`): kvmhealth/health.py renders both the same whoever probes, and
never knows whether there is a prober.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ate_devplugin.host.devices import DeviceNode, EscapesRootError, in_root, resolve_in_root
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.runner import ProbeRunner, Runner


class Change(Enum):
    ANSWERING = "answering"  # they answer now (a prober came): every resource is probed at once
    # Their verdicts no longer hold (the prober is gone: not proof of a broken device): each
    # device is judged by existence and the 10:232 check again.
    WITHDRAWN = "withdrawn"


@dataclass(frozen=True)
class Pending:
    """A present node with no verdict, as the probes see it now."""

    state: str = "unverified"  # the state's metric (observability/metrics.KVM_PROBE_STATES)
    said: str = ""  # what /readyz says of it after "KVM probe: "; "" says nothing
    # Whether a new node's probe follows at once: the verdict on the node before then holds
    # until it comes; otherwise that verdict goes with its node.
    follows: bool = False


class Probes(Protocol):
    async def start(self, changed: Callable[[Change], None]) -> None:
        """Begins; ``changed`` when they answer again or withdraw their verdicts (never where
        the daemon probes itself)."""

    def pending(self) -> Pending:
        """What holds of a present node with no verdict, now."""

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        """The verdict on ``node`` (bounded by ``timeout``); None when there is none to be had now."""

    def stale(self) -> None:
        """A verdict came of another node than the host's now."""

    async def close(self) -> None: ...


class LocalProbes:
    PENDING = Pending(said="no verdict yet", follows=True)

    def __init__(self, device_root: str, runner: Runner | None = None) -> None:
        self.device_root = device_root
        self.runner = runner or ProbeRunner()

    async def start(self, changed: Callable[[Change], None]) -> None:
        pass  # the daemon is its own prober: it never comes or goes

    def pending(self) -> Pending:
        return self.PENDING

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
    # Nothing will come: /readyz says nothing of it, and a verdict of the node before (not
    # 10:232) goes with it.
    PENDING = Pending()

    async def start(self, changed: Callable[[Change], None]) -> None:
        pass

    def pending(self) -> Pending:
        return self.PENDING

    async def probe(self, resource: str, node: DeviceNode, timeout: float) -> ProbeResult | None:
        return None

    def stale(self) -> None:
        pass

    async def close(self) -> None:
        pass
