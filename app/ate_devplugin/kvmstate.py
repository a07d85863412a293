"""The KVM health of each probed resource, as every consumer renders it.

The KVM health component (kvmhealth/) is the one owner of this state: per resource with
``health: kvm``, the verdict that holds, the node's facts (read once), what the last
passing probe learned of the device, and whether the node can restore each of the
resource's restore profiles (docs/restore-placement.md). It publishes every resource's state at once in a
:class:`KvmChanged` notice, which the supervisor's views alone hear (view.Views, :class:`HearsKvm`):
they build the one view every consumer renders of it, where a node that is not KVM's ``10:232``
fails whatever was said before, needing no probe to know it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ate_devplugin.config.model import RESTORE_PREFIX
from ate_devplugin.cpu.restore import UNKNOWN, Answer, RestoreProfile, restorable
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.kvm.attributes import Value, attributes
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts, cpu_profile
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason

KVM_RDEV = (10, 232)  # the misc device KVM always is (KVM_MINOR)


def not_kvm(node: DeviceNode) -> ProbeResult | None:
    """The verdict on a node that is not KVM's 10:232, never opened (opening an arbitrary
    character device can have effects of its own: a tape rewinds); None when it is KVM's."""
    if (node.major, node.minor) == KVM_RDEV:
        return None
    rdev = f"{node.major}:{node.minor}"
    detail = f"character device {rdev} is not KVM's {KVM_RDEV[0]}:{KVM_RDEV[1]}: not opened"
    return ProbeResult(device=node.host_path, reason=Reason.NOT_KVM, detail=detail, duration_s=0.0, rdev=rdev)


def probed_node(found: Discovery, device: str) -> DeviceNode | None:
    """The node a discovery found at the probed host path ``device``, if any."""
    return next((n for n in found.nodes if n.host_path == device), None)


def restore_answers(
    profiles: tuple[RestoreProfile, ...], node: NodeFacts, device: DeviceFacts | None
) -> tuple[Answer, ...]:
    """Whether the node can restore each profile, of its CPU profile (the node's facts and
    the device's, once a probe passed); unknown until then."""
    if device is None:
        unknown = ((UNKNOWN, "no probe has passed here yet: the CPU a guest is given is not known"),)
        return tuple(Answer(p.name, reasons=unknown) for p in profiles)
    cpu = cpu_profile(node, device)
    return tuple(restorable(p, cpu) for p in profiles)


def failure_text(verdict: ProbeResult) -> str:
    """What on-call reads of a failing verdict (/readyz, the DRA devices' health)."""
    return f"KVM probe failed: {verdict.reason}: {verdict.message}"


@dataclass(frozen=True)
class KvmState:
    """One probed resource's KVM health."""

    device: str  # the probed node's host path (ResourceConfig.probed_device)
    verdict: ProbeResult | None  # the verdict that holds; None: none does, existence alone counts
    node_facts: NodeFacts
    device_facts: DeviceFacts | None = None  # what the last passing probe learned
    restore: tuple[Answer, ...] = ()  # one per restore profile of the resource (restore_answers)

    def attributes(self) -> dict[str, Value]:
        """The facts as typed attributes (kvm/attributes.py): the node's, the device's once
        learned, and ``restore_<profile>``: whether the node can restore it (false while unknown,
        so that a selector of one plain term never meets a missing attribute)."""
        return {**attributes(self.node_facts, self.device_facts), **self.restore_attributes()}

    def restore_attributes(self) -> dict[str, Value]:
        return {f"{RESTORE_PREFIX}{a.profile}": a.restorable for a in self.restore}


KvmStates = Mapping[str, KvmState]  # by resource name: every probed resource


@runtime_checkable
class HearsKvm(Protocol):
    def on_kvm(self, states: KvmStates) -> None:
        """Every probed resource's state, after any of it changed; a resource absent from
        ``states`` is not probed (any more). The supervisor alone hears it (view.py)."""


@dataclass(frozen=True)
class KvmChanged:
    """The notice the KVM health component tells (components.Notice)."""

    states: KvmStates

    def deliver(self, component: object) -> None:
        if isinstance(component, HearsKvm):
            component.on_kvm(self.states)
