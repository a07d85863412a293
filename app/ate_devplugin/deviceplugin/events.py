"""What filesystem events mean to the device plugin: pure routing to typed events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ate_devplugin.host.watcher import FsEvent


@dataclass(frozen=True)
class KubeletSocketCreated:
    """kubelet.sock made anew: its identity is checked (restart, or first appearance)."""


@dataclass(frozen=True)
class SocketGone:
    resource: str  # the resource whose socket path changed (removed, or renamed over)


@dataclass(frozen=True)
class DirectoryAppeared:
    """Perhaps the plugin directory: agents that could not serve try again."""


Event = KubeletSocketCreated | SocketGone | DirectoryAppeared


def route(batch: Iterable[FsEvent], kubelet_socket: str, sockets: Mapping[str, str]) -> list[Event]:
    """The typed events a batch means, each at most once, in order. ``sockets`` maps each
    resource's socket path to its name.

    Device changes need no event of their own: after every batch the daemon discovers
    every resource's devices again.
    """
    out: list[Event] = []
    for e in batch:
        moved_or_made = e.kind in ("created", "moved")
        target = e.dest_path if e.kind == "moved" else e.path
        if moved_or_made and target == kubelet_socket:
            out.append(KubeletSocketCreated())
        if e.kind in ("deleted", "moved", "created"):
            # Removed, renamed away, or something renamed or made over it.
            out.extend(SocketGone(sockets[p]) for p in e.paths() if p in sockets)
        if e.is_directory and moved_or_made:
            out.append(DirectoryAppeared())
    return list(dict.fromkeys(out))
