"""The protocol every component of the daemon implements, so that the supervisor drives them alike.

A component is one job the daemon does on the node: serving the device plugin API
(deviceplugin.plugin), writing CDI specs (host.cdi), being a DRA driver (dra.plugin),
reading which pods hold units (deviceplugin.podresources). The supervisor (daemon.py)
starts each with the resource list and the guard its long-running tasks run under, hands
it every new resource list, every device discovery and the filesystem events of what it
asked to watch, asks whether it is ready and alive, and stops it within a deadline.

Handlers of discoveries and filesystem events are plain calls on the event loop: they
must not block, and they run one after the other within one step of the loop, so no
component sees the world between two others' reactions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

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

    def readiness(self) -> tuple[bool, str]:
        """Whether it does its job (and why not); the reason may be empty when ready."""

    def liveness(self) -> tuple[bool, str]:
        """False when something of it is stuck, saying what; the reason may be empty when alive."""

    def watches(self) -> Watches:
        """The directories, files and sockets whose events it needs; asked again after every
        batch, before and after the discoveries."""

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        """A batch of filesystem events; discoveries follow every batch, so device changes need no handling here."""

    async def on_resources(self, resources: Resources) -> None:
        """The config file was reloaded with this new resource list."""

    def on_discovery(self, found: Mapping[str, Discovery]) -> None:
        """What was found of every configured resource's devices, after every batch."""
