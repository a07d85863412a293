"""One view of each configured resource: what was discovered, its KVM state, the health of both.

The supervisor builds the view in one place (:func:`build`), from the current resource list,
after every batch: every resource of the list has exactly one :class:`ResourceView`, and
nothing else does, so no consumer can meet a resource the list does not have. The device
plugin, the DRA driver, the CDI specs, the NFD feature file and the PodResources watch
render it and keep no discovery or KVM state of their own; a KVM state the KVM health
component tells (kvmstate.KvmChanged) is the supervisor's, and asks for a new view through
the same path.

This is how the device lists of the upstream drivers carry health with each device: a
consumer never joins two streams, so the order in which they change cannot matter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import Discover, Discovery
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvmstate import KvmState, KvmStates, failure_text, not_kvm, probed_node


@dataclass(frozen=True)
class ResourceView:
    """One resource as every consumer renders it."""

    config: ResourceConfig
    found: Discovery
    kvm: KvmState | None = None  # its KVM state: None while not probed (or not told yet)
    verdict: ProbeResult | None = None  # the KVM verdict on the node found; None: existence alone counts

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def present(self) -> bool:
        """Every device node of the resource is there."""
        return self.found.complete

    @property
    def failing(self) -> ProbeResult | None:
        """The verdict that makes a present device unhealthy, if any."""
        return self.verdict if self.verdict is not None and not self.verdict.passed else None

    @property
    def healthy(self) -> bool:
        return self.present and self.failing is None

    @property
    def why(self) -> str:
        """The health in a sentence, as on-call reads it (/readyz, the DRA devices' health)."""
        if not self.present:
            return f"device node missing ({', '.join(self.config.devices)})"
        if (failing := self.failing) is not None:
            return failure_text(failing)
        return "every device node present"


View = Mapping[str, ResourceView]  # by resource name, in the resource list's order


def judge(state: KvmState, found: Discovery) -> ProbeResult | None:
    """The verdict on the node ``found`` holds: none while it is absent, not-a-kvm-device while
    it is not 10:232 (whatever was said before: that needs no probe), else the state's."""
    node = probed_node(found, state.device)
    if node is None:
        return None
    return not_kvm(node) or state.verdict


class Views:
    """The supervisor's builder: discovers the devices, hears the KVM state told
    (kvmstate.HearsKvm) and builds each view of both, remembering the last."""

    def __init__(self, discover: Discover, device_root: str) -> None:
        self._discover = discover
        self._root = device_root
        self.kvm: KvmStates = {}
        self.kvm_told = False  # a KVM state told since the last view: a new one is due
        self.last: View = {}

    def on_kvm(self, states: KvmStates) -> None:
        self.kvm, self.kvm_told = states, True

    def discover(self, resources: tuple[ResourceConfig, ...]) -> View:
        """The view of ``resources``, their devices discovered now."""
        return self._build(resources, {r.name: self._discover(r, self._root) for r in resources})

    def again(self) -> View:
        """The last view's resources and devices with the KVM state told since (a batch of
        notices alone changes no device)."""
        return self._build(tuple(v.config for v in self.last.values()), {n: v.found for n, v in self.last.items()})

    def _build(self, resources: tuple[ResourceConfig, ...], found: Mapping[str, Discovery]) -> View:
        self.last, self.kvm_told = build(resources, found, self.kvm), False
        return self.last


def build(resources: tuple[ResourceConfig, ...], found: Mapping[str, Discovery], kvm: KvmStates) -> View:
    """The view of every resource of ``resources``: ``found`` must hold each (the discovery of
    this list); a KVM state of a resource the list no longer probes is not part of it."""
    views = {}
    for r in resources:
        state = kvm.get(r.name) if r.probes_kvm else None
        if state is not None and state.device != r.probed_device:
            state = None  # of the resource as it was before a reload: its new state follows
        discovery = found[r.name]
        views[r.name] = ResourceView(r, discovery, state, None if state is None else judge(state, discovery))
    return views
