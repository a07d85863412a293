"""The KVM probe of each resource with ``health: kvm``, at start, on every change of its device
node and every period (jittered); its listeners (the device plugin, the DRA driver) are told
each verdict. Local mode: the daemon can open the device and probes it itself (the kubelet
bench, ``make demo``). Socket mode: a prober granted the device (the chart's prober pod)
probes it when asked over kvmhealth/link.py; before its first report and once it has been
gone for three periods there is no verdict (existence alone counts).

Probes run in kvm/runner.py's child process and are awaited on the loop: a probe that hangs
in the kernel costs its resource a ``timed-out`` verdict, never the loop, the kubelet's
streams or the stop. A node that is not KVM's ``10:232`` fails at once, unopened: opening an
arbitrary character device can have effects of its own (a tape rewinds), and no probe is
needed to know that it is not KVM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from ate_devplugin.components import Resources
from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import DeviceNode, Discovery, EscapesRootError, resolve_in_root
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.runner import Prober
from ate_devplugin.kvmhealth.link import ProberLink
from ate_devplugin.observability.metrics import KvmMetrics
from ate_devplugin.settings import KvmHealthSettings
from ate_devplugin.tasks import Guard, cancel

log = logging.getLogger(__name__)

KVM_RDEV = (10, 232)  # the misc device KVM always is (KVM_MINOR)
GONE_PERIODS = 3  # socket mode: a prober away this many periods takes its verdicts with it
JITTER = 0.1  # each period is drawn from period * (1 +- JITTER): nodes do not probe in step
REASONS = tuple(str(r) for r in Reason)

# Told every verdict of a resource; None: none holds (before the first, or the node is gone).
Listener = Callable[[str, ProbeResult | None], None]


class Probes(Protocol):
    """What probes a device: kvm/runner.py's Prober."""

    async def probe(self, device: str, timeout: float) -> ProbeResult: ...

    async def close(self) -> None: ...


@dataclass
class _Watched:
    """One probed resource: its node as last discovered, and its last verdict."""

    config: ResourceConfig
    node: DeviceNode | None = None
    changes: int = 0  # node changes seen: a probe's verdict holds only if none came meanwhile
    verdict: ProbeResult | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class KvmHealth:
    name = "kvm probe"

    def __init__(
        self,
        settings: KvmHealthSettings,
        metrics: KvmMetrics,
        prober: Probes | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.prober: Probes = prober or Prober()
        self.link: ProberLink | None = None
        if settings.kvm_probe == "socket":
            grace = GONE_PERIODS * (settings.kvm_probe_period or settings.kvm_probe_timeout)
            self.link = ProberLink(settings.kvm_probe_socket, grace, self._prober_came, self._prober_gone)
        self._prober_away_s: float | None = None  # set while the prober is gone (past its grace)
        self._rng = rng
        self.listeners: list[Listener] = []
        self._watched: dict[str, _Watched] = {}
        self._guard: Guard | None = None

    # --- the component --------------------------------------------------------------

    async def start(self, resources: Resources, guard: Guard) -> None:
        self._guard = guard
        if self.link is not None:
            await self.link.start()
        for resource in resources:
            self._add(resource)

    async def stop(self, deadline_s: float) -> list[str]:
        """The probing tasks cancelled (a probe in flight kills its worker), then the worker ended."""
        watched, self._watched = self._watched, {}
        ended = await asyncio.gather(*(cancel(w.task, deadline_s) for w in watched.values()))
        stuck = [f"kvm probe {name}" for name, done in zip(watched, ended, strict=True) if not done]
        try:
            closing = self.link.close() if self.link is not None else self.prober.close()
            await asyncio.wait_for(closing, max(deadline_s, 0.01))
        except TimeoutError:
            stuck.append("kvm probe worker")
        return stuck

    async def on_resources(self, resources: Resources) -> None:
        wanted = {r.name: r for r in resources if r.probes_kvm}
        for name in [n for n, w in self._watched.items() if wanted.get(n) != w.config]:
            await self._remove(name, 1.0)
        for resource in resources:
            if resource.name not in self._watched:
                self._add(resource)

    def on_discovery(self, found: Mapping[str, Discovery]) -> None:
        for name, watched in self._watched.items():
            discovery = found.get(name)
            node = (
                next((n for n in discovery.nodes if n.host_path == watched.config.probed_device), None)
                if discovery
                else None
            )
            if node == watched.node:
                continue
            watched.node = node
            watched.changes += 1
            if node is None:
                self._verdict(watched, None)  # gone: existence says so; the next node is probed afresh
            elif (node.major, node.minor) != KVM_RDEV:
                self._verdict(watched, _not_kvm(node))
            else:
                if self.link is not None and watched.verdict is not None and watched.verdict.reason is Reason.NOT_KVM:
                    # Of the node before: none holds until the prober reports on this one. Kept, it
                    # would outlast a prober that is gone, whose pod cannot come back while the units
                    # it requests are Unhealthy.
                    self._verdict(watched, None)
                watched.wake.set()

    def readiness(self) -> tuple[bool, str]:
        """Always ready (a broken device is the kubelet's to hear of, not a reason to restart
        the daemon); the text says each resource's probe that fails or has not answered yet."""
        said = []
        for name, watched in sorted(self._watched.items()):
            verdict = watched.verdict
            if verdict is not None and not verdict.passed:
                said.append(f"KVM probe failed: {verdict.reason}: {verdict.message} ({name})")
            elif verdict is None and watched.node is not None and self._prober_away_s is not None:
                said.append(f"KVM probe: no prober for {self._prober_away_s:.0f}s ({name})")
            elif verdict is None and watched.node is not None and self.link is not None:
                said.append(f"KVM probe: waiting for the prober ({name})")
            elif verdict is None and watched.node is not None:
                said.append(f"KVM probe: no verdict yet ({name})")
        return True, "; ".join(said)

    def verdict(self, resource: str) -> ProbeResult | None:
        watched = self._watched.get(resource)
        return watched.verdict if watched is not None else None

    # --- the resources --------------------------------------------------------------

    def _add(self, resource: ResourceConfig) -> None:
        if not resource.probes_kvm:
            return
        assert self._guard is not None, "started"
        watched = _Watched(resource)
        self._watched[resource.name] = watched
        self.metrics.add_resource(resource.name, REASONS)
        if self._prober_away_s is not None:
            self.metrics.set_state(resource.name, "prober-gone")  # added by a reload while it is away
        watched.task = self._guard.spawn("kvm_probe", self._run(watched), f"kvm probe {resource.name}")

    async def _remove(self, name: str, deadline_s: float) -> None:
        watched = self._watched.pop(name)
        if not await cancel(watched.task, deadline_s):
            log.error("the KVM probe of %s did not stop", name)
        self.metrics.remove_resource(name, REASONS)
        for listener in self.listeners:
            listener(name, None)

    async def _run(self, watched: _Watched) -> None:
        """Probes when woken (a new node) and every period while the node is KVM's."""
        while True:
            await self._sleep(watched)
            watched.wake.clear()
            node = watched.node
            if node is None or (node.major, node.minor) != KVM_RDEV:
                continue
            if self.link is not None:
                await self._ask_prober(watched, node)
                continue
            root = self.settings.device_root
            try:
                # Gone since (None): probed where it was, the verdict says so until its discovery.
                path = resolve_in_root(root, node.host_path) or os.path.join(root, node.host_path.lstrip("/")[4:])
            except EscapesRootError:
                continue  # a symlink swapped in since: its discovery follows, and ignores it
            changes = watched.changes
            result = await self.prober.probe(path, self.settings.kvm_probe_timeout)
            self.metrics.duration.labels(watched.config.name).observe(result.duration_s)
            # The node changed while it was probed (gone and back counts: the probe may have
            # found it missing): that verdict is of another node, and the new one is probed.
            if watched.changes != changes or (result.rdev and result.rdev != f"{node.major}:{node.minor}"):
                continue
            self._verdict(watched, _as_host_path(result, node.host_path))

    async def _ask_prober(self, watched: _Watched, node: DeviceNode) -> None:
        assert self.link is not None
        changes = watched.changes
        result = await self.link.probe(watched.config.name, self.settings.kvm_probe_timeout)
        if result is None:
            return  # no prober: the state stays until it comes (or its grace ends)
        self.metrics.duration.labels(watched.config.name).observe(result.duration_s)
        if watched.changes != changes:
            return  # the node changed while it was probed: that verdict is of another node
        if result.rdev and result.rdev != f"{node.major}:{node.minor}":
            self.link.restart()  # the prober's device is not the host's node now
            return
        self._verdict(watched, _as_host_path(result, node.host_path))

    def _prober_came(self) -> None:
        self._prober_away_s = None
        for name, watched in self._watched.items():
            if watched.verdict is None:
                self.metrics.set_state(name, "unverified")  # until its first report
            watched.wake.set()

    def _prober_gone(self, away_s: float) -> None:
        """No prober for the grace: its verdicts go (a missing prober is not proof of a broken
        device), the device is judged by existence and the 10:232 check again."""
        self._prober_away_s = away_s
        log.warning("no KVM prober for %.0fs: the devices are judged by existence", away_s)
        for watched in self._watched.values():
            if watched.verdict is not None and watched.verdict.reason is Reason.NOT_KVM:
                continue  # decided here, without the prober
            self._verdict(watched, None)

    async def _sleep(self, watched: _Watched) -> None:
        period = self.settings.kvm_probe_period
        if period <= 0 or watched.verdict is None or watched.node is None:
            await watched.wake.wait()
            return
        jittered = period * (1 + JITTER * (2 * self._rng() - 1))
        try:
            async with asyncio.timeout(jittered):
                await watched.wake.wait()
        except TimeoutError:
            pass

    def _verdict(self, watched: _Watched, result: ProbeResult | None) -> None:
        """``None``: no verdict holds, the state is prober-gone while the prober is (a node
        that changes meanwhile does not hide that it is), else unverified."""
        name = watched.config.name
        previous, watched.verdict = watched.verdict, result
        if result is None:
            self.metrics.set_state(name, "unverified" if self._prober_away_s is None else "prober-gone", REASONS)
        else:
            self.metrics.verdicts.labels(name, result.reason).inc()
            state = "passed" if result.passed else "failed"
            self.metrics.set_state(name, state, REASONS, str(result.reason))
            _say(name, previous, result)
        for listener in self.listeners:
            listener(name, result)


def _say(name: str, previous: ProbeResult | None, result: ProbeResult) -> None:
    """A failure once while its reason lasts, a pass when it is the first or ends a failure."""
    extra = {"resource": name, "reason": str(result.reason), "device": result.device, "rdev": result.rdev}
    if not result.passed:
        if previous is None or previous.reason != result.reason:
            log.warning("KVM probe failed: %s", result.message, extra=extra)
    elif previous is None or not previous.passed:
        log.info("KVM probe passed: %s", result.message, extra={**extra, "duration_s": round(result.duration_s, 4)})


def _not_kvm(node: DeviceNode) -> ProbeResult:
    rdev = f"{node.major}:{node.minor}"
    message = f"{node.host_path}: character device {rdev} is not KVM's {KVM_RDEV[0]}:{KVM_RDEV[1]}: not opened"
    return ProbeResult(device=node.host_path, reason=Reason.NOT_KVM, message=message, duration_s=0.0, rdev=rdev)


def _as_host_path(result: ProbeResult, host_path: str) -> ProbeResult:
    """The verdict on the host's path (the probe opened it under the device root)."""
    probed = result.device
    if probed == host_path:
        return result
    message = host_path + result.message[len(probed) :] if result.message.startswith(probed) else result.message
    return replace(result, device=host_path, message=message)
