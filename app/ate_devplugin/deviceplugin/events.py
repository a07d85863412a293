"""Typed lifecycle events, and the pure routing of raw filesystem events to them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ate_devplugin.host.watcher import FsEvent


@dataclass(frozen=True)
class KubeletSocketCreated:
    """kubelet.sock made anew: the daemon checks its identity (restart, or first appearance)."""


@dataclass(frozen=True)
class SocketGone:
    resource: str  # the resource whose socket path changed (removed, or renamed over)


@dataclass(frozen=True)
class DirectoryGone:
    path: str  # a watched directory removed or renamed away: its watches go


@dataclass(frozen=True)
class DirectoryAppeared:
    """Perhaps the plugin directory: agents that could not serve try again."""


@dataclass(frozen=True)
class ConfigChanged:
    """The config file may have changed (or SIGHUP asked to read it again)."""


@dataclass(frozen=True)
class PodResourcesChanged:
    """The kubelet's device manager rewrote its checkpoint (units allocated, or a plugin's
    device list received), or the PodResources socket was made anew (a kubelet restart)."""


@dataclass(frozen=True)
class Stop:
    why: str  # e.g. the signal's name


@dataclass(frozen=True)
class AgentDied:
    resource: str
    error: BaseException


Event = (
    KubeletSocketCreated
    | SocketGone
    | DirectoryGone
    | DirectoryAppeared
    | ConfigChanged
    | Stop
    | AgentDied
    | PodResourcesChanged
)


@dataclass(frozen=True)
class Paths:
    """What the router needs to know about the paths that matter."""

    kubelet_socket: str
    sockets: Mapping[str, str]  # socket path -> resource name
    config: str | None
    # The kubelet's device manager checkpoint and PodResources socket, when pods are read.
    checkpoint: str | None = None
    pod_resources_socket: str | None = None


def matters(event: FsEvent, quiet_dir: str | None, also: str | None = None) -> bool:
    """Whether a filesystem event can mean anything to the daemon.

    In ``quiet_dir`` (the plugin directory, when nothing else is watched there) only
    directories, sockets (``*.sock``: the kubelet's and every plugin's) and the file
    ``also`` (the kubelet's checkpoint, while pods holding units are read) do: the kubelet
    rewrites its checkpoint file there at every admission, and handling those events cost
    more CPU than the Allocate call itself.
    """
    if quiet_dir is None or event.is_directory:
        return True
    return any(os.path.dirname(p) != quiet_dir or p.endswith(".sock") or p == also for p in event.paths())


def route(batch: Iterable[FsEvent], paths: Paths) -> list[Event]:
    """The typed events a batch of filesystem events means, each at most once, in order.

    Device changes need no event of their own: after every batch the daemon discovers
    every resource's devices again.
    """
    config_dir = os.path.dirname(paths.config) if paths.config else None
    out: list[Event] = []
    for e in batch:
        moved_or_made = e.kind in ("created", "moved")
        target = e.dest_path if e.kind == "moved" else e.path
        if moved_or_made and target == paths.kubelet_socket:
            out.append(KubeletSocketCreated())
        if e.kind in ("deleted", "moved", "created"):
            # Removed, renamed away, or something renamed or made over it.
            for p in e.paths():
                if p in paths.sockets:
                    out.append(SocketGone(paths.sockets[p]))
        if e.is_directory and e.kind in ("deleted", "moved"):
            out.append(DirectoryGone(e.path))
        if e.is_directory and moved_or_made:
            out.append(DirectoryAppeared())
        if config_dir and any(os.path.dirname(p) == config_dir for p in e.paths()):
            out.append(ConfigChanged())
        if paths.checkpoint and target == paths.checkpoint and e.kind in ("moved", "created", "closed"):
            out.append(PodResourcesChanged())
        if moved_or_made and paths.pod_resources_socket and target == paths.pod_resources_socket:
            out.append(PodResourcesChanged())
    return list(dict.fromkeys(out))
