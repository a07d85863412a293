"""Finding a resource's device nodes under the device root.

Paths in the configuration are host paths (``/dev/kvm``); the device root is where the
host's ``/dev`` is visible to us (``/dev`` on the host, ``/host/dev`` in the chart).
Symlinks are resolved inside the root, as the host would see them, and a node that
resolves outside the root is ignored: the daemon never hands out what it cannot vouch for.

Everything here reads the filesystem through a :class:`FileSystem` port (default: the
``os`` module), so that the unit tests run unprivileged on an in-memory tree of nodes.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from ate_devplugin.config import ResourceConfig, is_glob

log = logging.getLogger(__name__)

HOST_DEV = PurePosixPath("/dev")
_MAX_SYMLINKS = 40


class Stat(Protocol):
    @property
    def st_mode(self) -> int: ...
    @property
    def st_rdev(self) -> int: ...


class FileSystem(Protocol):
    """What discovery reads; the ``os`` module is one."""

    def lstat(self, path: str) -> Stat: ...
    def stat(self, path: str) -> Stat: ...
    def readlink(self, path: str) -> str: ...
    def listdir(self, path: str) -> list[str]: ...


@dataclass(frozen=True, order=True)
class DeviceNode:
    host_path: str  # as the container runtime must be told, e.g. /dev/kvm
    major: int
    minor: int


@dataclass(frozen=True)
class Discovery:
    """What was found for one resource."""

    nodes: tuple[DeviceNode, ...]
    complete: bool  # every configured path (and every glob) matched at least one node


# What the daemon calls to find one resource's devices under a root (discover, or a fake).
Discover = Callable[[ResourceConfig, str], Discovery]


class EscapesRootError(Exception):
    pass


def resolve_in_root(root: str, host_path: str, fs: FileSystem = os) -> str | None:
    """The real path under ``root`` of ``host_path`` (a path under /dev), or None if absent.

    Symlinks are followed as if ``root`` were the host's /dev: absolute targets are
    host paths, relative ones relative to the link. Raises EscapesRootError when the chain
    leaves /dev.
    """
    parts = list(PurePosixPath(host_path).relative_to(HOST_DEV).parts)
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise EscapesRootError(host_path)
            resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            st = fs.lstat(candidate)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise EscapesRootError(host_path)
            target = PurePosixPath(fs.readlink(candidate))
            if target.is_absolute():
                try:
                    rel = target.relative_to(HOST_DEV)
                except ValueError:
                    raise EscapesRootError(host_path) from None
                resolved = []
                parts = list(rel.parts) + parts
            else:
                parts = list(target.parts) + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def in_root(root: str, host_path: str) -> str:
    """Where ``host_path`` (a path under /dev) is under ``root``, no symlink followed."""
    return os.path.join(root, *PurePosixPath(host_path).relative_to(HOST_DEV).parts)


def _char_device(root: str, host_path: str, fs: FileSystem) -> DeviceNode | None:
    try:
        real = resolve_in_root(root, host_path, fs)
    except EscapesRootError:
        log.warning("ignoring %s: it resolves outside the device root %s", host_path, root)
        return None
    if real is None:
        return None
    try:
        st = fs.stat(real)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        log.warning("ignoring %s: not a character device", host_path)
        return None
    return DeviceNode(host_path, os.major(st.st_rdev), os.minor(st.st_rdev))


def _expand(root: str, pattern: str, fs: FileSystem) -> list[str]:
    """Host paths under /dev matching a glob, walking only the directories it names."""
    matches = [str(HOST_DEV)]
    for part in PurePosixPath(pattern).relative_to(HOST_DEV).parts:
        next_matches: list[str] = []
        for base in matches:
            if not is_glob(part):
                next_matches.append(f"{base}/{part}")
                continue
            try:
                real = resolve_in_root(root, base, fs)
            except EscapesRootError:
                continue
            if real is None:
                continue
            try:
                names = sorted(fs.listdir(real))
            except OSError:
                continue
            next_matches.extend(f"{base}/{n}" for n in fnmatch.filter(names, part) if not n.startswith("."))
        matches = next_matches
    return matches


def discover(resource: ResourceConfig, root: str, fs: FileSystem = os) -> Discovery:
    nodes: dict[str, DeviceNode] = {}
    complete = True
    for path in resource.devices:
        paths = _expand(root, path, fs) if is_glob(path) else [path]
        found = [n for p in paths if (n := _char_device(root, p, fs))]
        complete = complete and bool(found)
        nodes.update((n.host_path, n) for n in found)
    return Discovery(nodes=tuple(sorted(nodes.values())), complete=complete)


def watch_dirs(resource: ResourceConfig, root: str, fs: FileSystem = os) -> set[str]:
    """Directories under the root whose events can change this resource's discovery.

    Every existing directory from the root down each configured path, so that a parent
    made or removed at any depth is seen. Glob parts stop the descent: the directory
    above the first glob part is the deepest watched.
    """
    dirs = {root}
    for path in resource.devices:
        current = root
        for part in PurePosixPath(path).parent.relative_to(HOST_DEV).parts:
            nxt = os.path.join(current, part)
            if is_glob(part) or not _is_real_dir(nxt, fs):
                break
            dirs.add(nxt)
            current = nxt
    return dirs


def _is_real_dir(path: str, fs: FileSystem) -> bool:
    """A directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(fs.lstat(path).st_mode)
    except OSError:
        return False
