"""Filesystem events from inotify, read on the event loop itself.

What to watch is said as :class:`Watches`, the union of what every component asked for.
The kernel is asked, per directory, only for the kinds of event that can matter there,
and the inotify descriptor is read when the loop finds it readable: no thread, and an
event that cannot matter is dropped before anything else wakes. watchdog provides the
inotify calls and constants; the few kinds of event used here are decoded here.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import struct
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from watchdog.observers.inotify_c import (
    InotifyConstants,
    WatchDescriptor,
    inotify_add_watch,
    inotify_init,
    inotify_rm_watch,
)

from ate_devplugin.host.sockets import socket_identity

log = logging.getLogger(__name__)

# A watched path that is a symbolic link is not followed; the watched path itself renamed
# or removed ends its watch (it no longer names what is watched).
_ITSELF = InotifyConstants.IN_DELETE_SELF | InotifyConstants.IN_MOVE_SELF | InotifyConstants.IN_DONT_FOLLOW
# Entries made in a directory, or renamed into it.
_MADE = InotifyConstants.IN_CREATE | InotifyConstants.IN_MOVED_TO
# Every change of what a directory holds, and files closed after writing (a config file
# edited in place).
EVERYTHING = (
    _ITSELF | _MADE | InotifyConstants.IN_DELETE | InotifyConstants.IN_MOVED_FROM | InotifyConstants.IN_CLOSE_WRITE
)
# A directory where only some files matter: they are made, renamed over or written.
FILES = _ITSELF | _MADE | InotifyConstants.IN_CLOSE_WRITE
# A directory where only sockets matter, each watched itself while it exists; its
# entries' making only while one of them is awaited.
SOCKETS = _ITSELF
AWAITING = _ITSELF | _MADE
# A socket file: unlinked or renamed over (its link count changes), or renamed away.
SOCKET = _ITSELF | InotifyConstants.IN_ATTRIB
Identity = tuple[int, int]  # st_dev, st_ino
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; the name follows
# Hundreds of events a read; the kernel never splits one.
_READ_BYTES = 64 * 1024
# Plans made again in one watch() while planned paths vanish before their watch: each
# time the plan moves up at least one directory, so this bounds it for any real path.
_REPLANS = 32


@dataclass(frozen=True)
class FsEvent:
    kind: str  # created, deleted, moved (renamed: path to dest_path), closed (after writing)
    path: str
    dest_path: str
    is_directory: bool

    def paths(self) -> tuple[str, ...]:
        return (self.path, self.dest_path) if self.dest_path else (self.path,)


@dataclass(frozen=True)
class Watches:
    """What to watch: ``dirs``, directories whose every event may matter; ``files``, files
    whose every rewrite matters; ``sockets``, sockets whose removal or replacement matters,
    and their making while absent. In the directories of files and sockets nothing else
    matters, and the kernel is not even asked for it: the kubelet rewrites its checkpoint
    in its plugin directory at every admission and at every device list, which would
    otherwise wake the daemon each time. A directory that does not exist yet is watched
    through its nearest existing ancestor, in full, so that its making is seen."""

    dirs: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()
    sockets: frozenset[str] = frozenset()

    def __or__(self, other: Watches) -> Watches:
        return Watches(self.dirs | other.dirs, self.files | other.files, self.sockets | other.sockets)


@dataclass(frozen=True)
class Plan:
    """What the kernel is asked for: an inotify mask per path (directories, and sockets
    that exist), the directories where only the named files and sockets matter, and the
    sockets whose making the kernel reports (their directory exists, they do not)."""

    masks: dict[str, int]
    named_dirs: frozenset[str]
    names: frozenset[str]
    awaited: frozenset[str]


def plan(watches: Watches) -> Plan:
    masks: dict[str, int] = {}
    full: set[str] = set()
    awaited: set[str] = set()

    def add(path: str, mask: int) -> None:
        masks[path] = masks.get(path, 0) | mask

    for d in watches.dirs:
        full.add(nearest_existing(d))
    for name in watches.files | watches.sockets:
        d = os.path.dirname(name)
        found = nearest_existing(d)
        if found != d:
            full.add(found)  # the directory is awaited
        elif name in watches.files:
            add(d, FILES)
        elif socket_identity(name) is None:
            add(d, AWAITING)
            awaited.add(name)
        else:
            add(d, SOCKETS)
            add(name, SOCKET)
    for path in full:
        add(path, EVERYTHING)
    named = frozenset(p for p in masks if p not in full and p not in watches.sockets)
    return Plan(masks, named, watches.files | watches.sockets, frozenset(awaited))


def matters(event: FsEvent, named_dirs: Collection[str], names: Collection[str]) -> bool:
    """Whether a filesystem event can mean anything: in ``named_dirs`` only the ``names`` do."""
    return any(os.path.dirname(p) not in named_dirs or p in names for p in event.paths())


def removed_dirs(batch: Iterable[FsEvent]) -> list[str]:
    """Directories removed or renamed away: their watches must go."""
    return [e.path for e in batch if e.is_directory and e.kind in ("deleted", "moved")]


def touches(batch: Iterable[FsEvent], directory: str) -> bool:
    """Whether an event names a path directly in ``directory`` (a config file's, say)."""
    return any(os.path.dirname(p) == directory for e in batch for p in e.paths())


def decode(data: bytes, paths: dict[int, tuple[str, bool]]) -> Iterator[FsEvent | None]:
    """The events of one read of an inotify descriptor whose watches are ``paths`` (watch
    descriptor -> path, and whether it is a directory); ``None`` where the kernel's queue
    overflowed and events were lost. A rename within the watched directories is one
    ``moved`` event; a rename from elsewhere reads as a creation, one to elsewhere as a
    removal, and so does a watched path itself renamed. A watched socket whose links or
    mode changed is ``changed``: unlinked or renamed over, or not (see Watcher)."""
    moved_from: dict[int, FsEvent] = {}  # cookie -> the rename's source, until its target
    pos = 0
    while pos + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, pos)
        name = os.fsdecode(data[pos + _HEADER.size : pos + _HEADER.size + length].rstrip(b"\0"))
        pos += _HEADER.size + length
        if mask & InotifyConstants.IN_Q_OVERFLOW:
            yield None
            continue
        watched = paths.get(wd)
        if watched is None:
            continue  # the last events of a watch removed since
        directory, is_watched_dir = watched
        if mask & (InotifyConstants.IN_DELETE_SELF | InotifyConstants.IN_MOVE_SELF):
            yield FsEvent("deleted", directory, "", is_watched_dir)
            continue
        if mask & InotifyConstants.IN_ATTRIB:
            yield FsEvent("changed", directory, "", False)
            continue
        is_dir = bool(mask & InotifyConstants.IN_ISDIR)
        path = os.path.join(directory, name) if name else directory
        if mask & InotifyConstants.IN_MOVED_FROM:
            moved_from[cookie] = FsEvent("deleted", path, "", is_dir)
        elif mask & InotifyConstants.IN_MOVED_TO:
            source = moved_from.pop(cookie, None)
            if source is None:
                yield FsEvent("created", path, "", is_dir)
            else:
                yield FsEvent("moved", source.path, path, is_dir)
        elif mask & InotifyConstants.IN_CREATE:
            yield FsEvent("created", path, "", is_dir)
        elif mask & InotifyConstants.IN_DELETE:
            yield FsEvent("deleted", path, "", is_dir)
        elif mask & InotifyConstants.IN_CLOSE_WRITE:
            yield FsEvent("closed", path, "", is_dir)
    yield from moved_from.values()  # renamed out of every watched directory


class Watcher:
    """Watches directories (non-recursively) and sockets, and can change the set at any time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, put: Callable[[FsEvent], None]) -> None:
        """``put`` receives every event that matters, on the loop's thread."""
        self._loop = loop
        self._put = put
        self._fd = -1
        self._plan = Plan({}, frozenset(), frozenset(), frozenset())
        self._sockets: frozenset[str] = frozenset()
        self._awaited: frozenset[str] = frozenset()
        # Each watch is kept with what it watches: a directory removed and made again, or
        # a socket bound anew, under the same name needs a new watch.
        self._watches: dict[str, tuple[int, Identity, int]] = {}  # path -> wd, identity, mask
        self._paths: dict[int, tuple[str, bool]] = {}  # wd -> path, is a directory

    def start(self) -> None:
        self._fd = open_inotify()
        self._loop.add_reader(self._fd, self._read)

    def watch(self, watches: Watches) -> None:
        """Watches what ``watches`` says from now on. A socket watched under a new identity
        (first seen, or bound anew) is reported as made unless its making was awaited: it
        may have been made while nothing watched for it. A watched directory found replaced
        (a new identity under its name, its old watch's events unread) is reported as made
        anew, so that what it holds is looked at again. A path removed between planning
        and its watch is reported as removed, and the plan made again, so that its nearest
        ancestor is watched: nothing is left unwatched by the race."""
        for _ in range(_REPLANS):
            vanished = self._apply(watches)
            if not vanished:
                return
            for path in vanished:
                self._put(FsEvent("deleted", path, "", path not in self._sockets))
        log.warning("watched paths kept vanishing while being watched; the next event plans again")

    def _apply(self, watches: Watches) -> list[str]:
        """Arms the watches of one plan; returns the planned paths gone before their watch."""
        awaited = self._awaited
        self._plan, self._sockets = plan(watches), watches.sockets
        self._awaited = self._plan.awaited
        wanted = self._plan.masks
        replaced = set()
        for path, (_, ident, _) in list(self._watches.items()):
            if path in wanted and self._identity(path) != ident:
                # Replaced since its events were last read: they go with its watch, unread.
                self._remove(path)
                replaced.add(path)
        vanished = []
        for path, mask in wanted.items():
            found = self._identity(path)
            known = self._watches.get(path)
            if found is None:
                vanished.append(path)
                continue
            if known is not None and known[1:] == (found, mask):
                continue
            # A new watch, or the same one with another mask (inotify keeps its descriptor).
            wd = inotify_add_watch(self._fd, os.fsencode(path), mask)
            if wd < 0:
                code = ctypes.get_errno()
                if code in (errno.ENOENT, errno.ENOTDIR):
                    vanished.append(path)
                else:
                    log.warning("cannot watch %s: %s", path, os.strerror(code))
                continue
            self._watches[path] = (wd, found, mask)
            self._paths[wd] = (path, path not in self._sockets)
            if path in replaced or (path in self._sockets and known is None and path not in awaited):
                self._put(FsEvent("created", path, "", path not in self._sockets))
        # Old watches end only once the new ones are armed: no moment watches neither.
        for path in [p for p in self._watches if p not in wanted]:
            self._remove(path)
        return vanished

    def forget(self, removed: str) -> None:
        """Drops the watches of a removed directory and of everything below it.

        A directory made again under the name may get the old inode number back (ext4),
        so identity alone cannot tell the new one needs a watch of its own.
        """
        for path in [p for p in self._watches if p == removed or p.startswith(removed + "/")]:
            self._remove(path)

    def stop(self) -> None:
        """Closes the inotify descriptor, which ends every watch."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._watches.clear()
        self._paths.clear()

    def _identity(self, path: str) -> Identity | None:
        if path in self._sockets:
            found = socket_identity(path)
            return None if found is None else found[:2]
        return _identity(path)

    def _remove(self, path: str) -> None:
        wd, _, _ = self._watches.pop(path)
        self._paths.pop(wd, None)
        inotify_rm_watch(self._fd, WatchDescriptor(wd))  # fails harmlessly when the path went already

    def _read(self) -> None:
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return
        for event in decode(data, self._paths):
            if event is None:
                self._overflowed()
                continue
            if event.kind == "changed":
                # Unlinked or renamed over, or only its mode or owner changed.
                watched = self._watches.get(event.path)
                if watched is not None and self._identity(event.path) == watched[1]:
                    continue
                event = FsEvent("deleted", event.path, "", False)
            if event.path in self._sockets and event.kind == "deleted":
                self._remove(event.path)  # watched anew, if bound anew, at the next watch()
            if matters(event, self._plan.named_dirs, self._plan.names):
                self._put(event)

    def _overflowed(self) -> None:
        """Events were lost: every watched directory and what it holds is reported as made
        anew, so that each component checks again what it cares about."""
        log.warning("inotify queue overflowed: events were lost; every watched directory is read again")
        for path in [p for p in self._watches if p not in self._sockets]:
            self._put(FsEvent("created", path, "", True))
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            for entry in entries:
                event = FsEvent("created", entry.path, "", entry.is_dir(follow_symlinks=False))
                if matters(event, self._plan.named_dirs, self._plan.names):
                    self._put(event)


def open_inotify() -> int:
    """A new inotify descriptor, non-blocking, not inherited; raises OSError."""
    fd = inotify_init()
    if fd < 0:
        code = ctypes.get_errno() or errno.EMFILE
        raise OSError(code, f"cannot start inotify: {os.strerror(code)}")
    os.set_blocking(fd, False)
    os.set_inheritable(fd, False)
    return fd


def _identity(path: str) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def nearest_existing(path: str) -> str:
    """The path itself if it is a directory, else its closest existing ancestor."""
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
