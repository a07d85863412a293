"""What the supervisor drives: components, each one job the daemon does on the node.

Serving the device plugin API (deviceplugin.plugin), writing CDI specs (host.cdi), being a
DRA driver (dra.plugin), reading which pods hold units (podresources.watch). Every
component is started with the resource list and the guard its long-running tasks run
under, hears every new resource list and renders every view of the resources (view.py:
what was discovered, the KVM state and the health of both), and is stopped within a
deadline (:class:`Component`). What only some need is a capability of its own, which the
supervisor asks each component for: saying whether it is ready (:class:`Readiness`) or
stuck (:class:`Liveness`), watching the filesystem (:class:`Watching`), telling the
others something through the supervisor (:class:`Telling`) and hearing what they tell
(a capability per notice: :class:`HearsClaims` here, kvmstate.HearsKvm).

Handlers of views and filesystem events are plain calls on the event loop: they must not
block, and they run one after the other within one step of the loop, so no component sees
the world between two others' reactions. Components are started and told in the order they
were built, but none relies on that order: each works from what it is told (the PodResources
watch lists first at the first view, not at its start).

A notice (:class:`Notice`) is told through the supervisor's inbox, like a filesystem
event, never by one component calling another: the supervisor delivers it to every
component that hears it (the supervisor itself hears the KVM state, to build the view of
it) at its next step, inside the stall watchdog, and every notice told before a view is
built before that view (so what a component said at its start is in the first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.tasks import Guard
from ate_devplugin.view import View

Resources = tuple[ResourceConfig, ...]


class Component(Protocol):
    @property
    def name(self) -> str: ...

    async def start(self, resources: Resources, guard: Guard) -> None:
        """Begins; every task that outlives this call is started with ``guard.spawn``."""

    async def stop(self, deadline_s: float) -> list[str]:
        """Ends within ``deadline_s``; returns what is still running (nothing, normally)."""

    async def on_resources(self, resources: Resources) -> None:
        """The config file was reloaded with this new resource list."""

    def on_view(self, view: View) -> None:
        """Every configured resource as it is now (view.py): after every batch, and after a
        KVM state changed; the view of the resource list the last ``on_resources`` gave."""


@runtime_checkable
class Readiness(Protocol):
    def readiness(self) -> tuple[bool, str]:
        """Whether it does its job (and why not); the reason may be empty when ready."""


@runtime_checkable
class Liveness(Protocol):
    def liveness(self) -> tuple[bool, str]:
        """False when something of it is stuck, saying what; the reason may be empty when alive."""


@runtime_checkable
class Watching(Protocol):
    def watches(self) -> Watches:
        """The directories, files and sockets whose events it needs; asked again after every
        batch, before and after each view."""

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        """A batch of filesystem events; a view follows every batch, so device changes need no handling here."""


class Notice(Protocol):
    """Something one component tells the others (e.g. kvmstate.KvmChanged)."""

    def deliver(self, component: object) -> None:
        """Hands it to ``component`` if it hears this kind of notice (its capability)."""


Tell = Callable[[Notice], None]


class Notices:
    """Notices told and not yet delivered: of each kind the last (each carries the whole of
    what it says, so an older one of its kind is moot)."""

    def __init__(self) -> None:
        self._pending: dict[type, Notice] = {}

    def add(self, notice: Notice) -> None:
        self._pending[type(notice)] = notice

    def deliver(self, components: Sequence[object]) -> None:
        """Each pending notice to every component that hears its kind."""
        pending, self._pending = self._pending, {}
        for notice in pending.values():
            for component in components:
                notice.deliver(component)


@runtime_checkable
class Telling(Protocol):
    def tell_to(self, tell: Tell) -> None:
        """Where its notices go (the supervisor's inbox); given once, before it starts."""


@runtime_checkable
class HearsClaims(Protocol):
    def on_claims_changed(self) -> None:
        """The DRA driver answered a prepare or unprepare: which pods hold devices may have changed."""


@dataclass(frozen=True)
class ClaimsChanged:
    """The notice the DRA driver tells after it answered a prepare or unprepare."""

    def deliver(self, component: object) -> None:
        if isinstance(component, HearsClaims):
            component.on_claims_changed()
