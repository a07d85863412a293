"""What the supervisor drives: components, each one job the daemon does on the node.

Serving the device plugin API (deviceplugin.plugin), writing CDI specs (host.cdi), being a
DRA driver (dra.plugin), reading which pods hold units (podresources.watch). Every
component is started with the resource list and the guard its long-running tasks run
under, hears every new resource list and every device discovery, and is stopped within a
deadline (:class:`Component`). What only some need is a capability of its own, which the
supervisor asks each component for: saying whether it is ready (:class:`Readiness`) or
stuck (:class:`Liveness`), and watching the filesystem (:class:`Watching`).

Handlers of discoveries and filesystem events are plain calls on the event loop: they
must not block, and they run one after the other within one step of the loop, so no
component sees the world between two others' reactions. Components are started and told
in the order they were built, but none relies on that order: each works from what it is
told (the PodResources watch lists first at the first discovery, not at its start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import Discovery
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.tasks import Guard

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

    def on_discovery(self, found: Mapping[str, Discovery]) -> None:
        """What was found of every configured resource's devices, after every batch."""


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
        batch, before and after the discoveries."""

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        """A batch of filesystem events; discoveries follow every batch, so device changes need no handling here."""
