"""The KVM health component: the one owner of each probed resource's KVM state (kvmstate.py).

Each resource with ``health: kvm`` is probed at start, on every change of its device node
and every period (monitor.py's schedule), by the daemon itself or by the prober pod
(probes.py). Each verdict updates the resource's state, its metrics and log, and the state
of every resource is told to the other components at once (kvmstate.KvmChanged). A node
that is not KVM's ``10:232`` fails at once, unopened (kvmstate.not_kvm). A node with no
verdict (none yet, or the probes withdrew theirs) is judged by existence, and rendered as
the probes say (probes.Pending): this module never knows whether there is a prober.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from ate_devplugin.components import Resources, Tell
from ate_devplugin.config import ResourceConfig
from ate_devplugin.cpu.restore import CODES
from ate_devplugin.host.devices import DeviceNode
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import CANNOT_PROBE, Reason
from ate_devplugin.kvmhealth.monitor import Schedule
from ate_devplugin.kvmhealth.probes import Change, Probes
from ate_devplugin.kvmstate import KvmChanged, KvmState, failure_text, not_kvm, probed_node, restore_answers
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import KvmMetrics
from ate_devplugin.settings import KvmHealthSettings
from ate_devplugin.tasks import Guard
from ate_devplugin.view import View

log = logging.getLogger(__name__)

REASONS = tuple(str(r) for r in Reason)
REMOVE_S = 1.0  # a resource a reload took away: its probe's task ends within this long


@dataclass
class _Probed:
    """One probed resource: its node as last discovered, and what holds of it."""

    config: ResourceConfig
    state: KvmState  # as last told
    node: DeviceNode | None = None
    changes: int = 0  # node changes seen: a probe's verdict holds only if none came meanwhile
    cannot: ProbeResult | None = None  # the probe could not judge the device (CANNOT_PROBE): why

    @property
    def verdict(self) -> ProbeResult | None:
        return self.state.verdict


class KvmHealth:
    name = "kvm probe"

    def __init__(
        self,
        settings: KvmHealthSettings,
        metrics: KvmMetrics,
        probes: Probes,
        node_facts: NodeFacts,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.probes = probes
        self.node_facts = node_facts  # read once, by the composition root
        self.schedule = Schedule(settings.kvm_probe_period, self._probe, self._periodic, rng)
        self._probed: dict[str, _Probed] = {}
        self._failures = SaidOnce()  # the failure logged, per resource, while it lasts
        self._answers = SaidOnce()  # the restore answer logged, per resource and profile, until it changes
        self._tell: Tell | None = None
        self._guard: Guard | None = None

    # --- the component --------------------------------------------------------------

    def tell_to(self, tell: Tell) -> None:
        self._tell = tell

    async def start(self, resources: Resources, guard: Guard) -> None:
        self._guard = guard
        await self.probes.start(self._probes_changed)
        for resource in resources:
            self._add(resource)
        self._publish()

    async def stop(self, deadline_s: float) -> list[str]:
        """The probing tasks cancelled (a probe in flight kills its worker), then the probes closed."""
        stuck = [f"kvm probe {name}" for name in await self.schedule.stop(deadline_s)]
        self._probed = {}
        try:
            await asyncio.wait_for(self.probes.close(), max(deadline_s, 0.01))
        except TimeoutError:
            stuck.append("kvm probe worker")
        return stuck

    async def on_resources(self, resources: Resources) -> None:
        wanted = {r.name: r for r in resources if r.probes_kvm}
        for name in [n for n, p in self._probed.items() if n not in wanted or not wanted[n].serves_as(p.config)]:
            await self._remove(name)
        for resource in resources:
            if resource.name not in self._probed:
                self._add(resource)
            elif (probed := self._probed[resource.name]).config != resource:  # its restore profiles alone
                self._forget_restore(probed)
                probed.config = resource
                probed.state = self._state(resource, probed.state.verdict, probed.state.device_facts)
        self._publish()

    def on_view(self, view: View) -> None:
        """The probed nodes as found: a changed one is judged again (its state told anew)."""
        for name, probed in self._probed.items():
            v = view.get(name)
            node = probed_node(v.found, probed.config.probed_device) if v else None
            if node == probed.node:
                continue
            probed.node = node
            probed.changes += 1
            if node is None:
                self._set(probed, None)  # gone: existence says so; the next node is probed afresh
            elif (verdict := not_kvm(node)) is not None:
                self._set(probed, verdict)
            else:
                if not self.probes.pending().follows and probed.verdict and probed.verdict.reason is Reason.NOT_KVM:
                    self._set(probed, None)  # of the node before: none holds until it is probed
                self.schedule.wake(name)

    def readiness(self) -> tuple[bool, str]:
        """Always ready (a broken device is the kubelet's to hear of, not a reason to restart
        the daemon); the text says each resource's probe that fails or has not answered yet."""
        said = []
        for name, probed in sorted(self._probed.items()):
            verdict = probed.verdict
            if verdict is not None and not verdict.passed:
                said.append(f"{failure_text(verdict)} ({name})")
            elif probed.cannot is not None:
                said.append(
                    f"KVM probe could not judge the device: {probed.cannot.reason}: {probed.cannot.message} ({name})"
                )
            elif verdict is None and probed.node is not None and (pending := self.probes.pending().said):
                said.append(f"KVM probe: {pending} ({name})")
        return True, "; ".join(said)

    # --- the resources --------------------------------------------------------------

    def _add(self, resource: ResourceConfig) -> None:
        if not resource.probes_kvm:
            return
        assert self._guard is not None, "started"
        self._probed[resource.name] = _Probed(resource, self._state(resource, None, None))
        self.metrics.add_resource(resource.name, REASONS)
        self.metrics.set_state(resource.name, self.probes.pending().state)  # added by a reload: as the others
        self.schedule.add(resource.name, self._guard)

    async def _remove(self, name: str) -> None:
        probed = self._probed.pop(name)
        if not await self.schedule.remove(name, REMOVE_S):
            log.error("the KVM probe of %s did not stop", name)
        self.metrics.remove_resource(name, REASONS)
        self._failures.over(name)
        self._forget_restore(probed)

    def _periodic(self, name: str) -> bool:
        """Probed again every period only while a probe answered of a present node."""
        probed = self._probed.get(name)
        answered = probed is not None and (probed.verdict is not None or probed.cannot is not None)
        return answered and probed is not None and probed.node is not None

    async def _probe(self, name: str) -> None:
        probed = self._probed[name]
        node = probed.node
        if node is None or not_kvm(node) is not None:
            return
        changes = probed.changes
        result = await self.probes.probe(name, node, self.settings.kvm_probe_timeout)
        if result is None:
            return  # nobody to ask: the state stays until the probes say it changed
        self.metrics.duration.labels(name).observe(result.duration_s)
        # The node changed while it was probed (gone and back counts: the probe may have
        # found it missing): that verdict is of another node, and the new one is probed.
        if probed.changes != changes:
            return
        if result.rdev and result.rdev != f"{node.major}:{node.minor}":
            self.probes.stale()
            return
        # The verdict is on the host's path (the probe opened it under the device root, or
        # in the prober's container): the path is a field, the message says it from there.
        self._set(probed, replace(result, device=node.host_path))

    def _probes_changed(self, change: Change) -> None:
        """They answer again: the nodes with no verdict say so, and every one is probed. They
        withdrew their verdicts: those go, the device is judged by existence and the 10:232
        check again."""
        if change is Change.WITHDRAWN:
            for probed in self._probed.values():
                if probed.verdict is None or probed.verdict.reason is not Reason.NOT_KVM:  # that one is decided here
                    self._set(probed, None)
            return
        state = self.probes.pending().state
        for name, probed in self._probed.items():
            if probed.verdict is None:
                self.metrics.set_state(name, state)  # until its first verdict
        self.schedule.wake_all()

    def _set(self, probed: _Probed, result: ProbeResult | None) -> None:
        """``None``: no verdict holds, the state is what the probes say (probes.Pending: a node
        that changes meanwhile does not hide that the prober is gone). A result that says the
        probe could not judge the device holds no verdict either (existence counts): its state
        is cannot-probe, with its reason."""
        name = probed.config.name
        previous = probed.cannot or probed.verdict
        facts: DeviceFacts | None = probed.state.device_facts
        probed.cannot = result if result is not None and result.reason in CANNOT_PROBE else None
        if result is None:
            self.metrics.set_state(name, self.probes.pending().state, REASONS)
            self._failures.over(name)
        else:
            self.metrics.verdicts.labels(name, result.reason).inc()
            state = "cannot-probe" if probed.cannot else "passed" if result.passed else "failed"
            self.metrics.set_state(name, state, REASONS, str(result.reason))
            self._say(name, previous, result)
            if result.passed and result.device_facts is not None:
                facts = result.device_facts
        probed.state = self._state(probed.config, None if probed.cannot else result, facts)
        self._publish()

    def _state(self, config: ResourceConfig, verdict: ProbeResult | None, facts: DeviceFacts | None) -> KvmState:
        """The resource's state, its restore answers with it (said once each, and in the metric)."""
        answers = restore_answers(config.restore_profiles, self.node_facts, facts)
        for answer in answers:
            self.metrics.set_restore(config.name, answer.profile, answer.code, CODES)
            if self._answers.new(str(answer), f"{config.name} {answer.profile}"):
                log.info("restore profile %s", answer, extra={"resource": config.name, "profile": answer.profile})
        return KvmState(config.probed_device, verdict, self.node_facts, facts, answers)

    def _forget_restore(self, probed: _Probed) -> None:
        for answer in probed.state.restore:
            self.metrics.remove_restore(probed.config.name, answer.profile, CODES)
            self._answers.over(f"{probed.config.name} {answer.profile}")

    def _say(self, name: str, previous: ProbeResult | None, result: ProbeResult) -> None:
        """A failure once while its reason lasts, a pass when it is the first or ends a failure."""
        extra = {"resource": name, "reason": str(result.reason), "device": result.device, "rdev": result.rdev}
        if result.reason in CANNOT_PROBE:
            if self._failures.new(str(result.reason), name):
                log.warning("KVM probe could not judge the device: %s", result.message, extra=extra)
        elif not result.passed:
            if self._failures.new(str(result.reason), name):
                log.warning("KVM probe failed: %s", result.message, extra=extra)
        elif self._failures.over(name) or previous is None:
            log.info("KVM probe passed: %s", result.message, extra={**extra, "duration_s": round(result.duration_s, 4)})

    def _publish(self) -> None:
        assert self._tell is not None, "told where to tell (tell_to) before it starts"
        self._tell(KvmChanged({name: probed.state for name, probed in self._probed.items()}))
