"""Filesystem events (inotify through watchdog), handed to the event loop in one place.

What to watch is said as :class:`Watches`, the union of what every component asked for;
the events that cannot matter are dropped on the observer's thread, before the loop is
even woken.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import ObservedWatch
from watchdog.observers.inotify import InotifyObserver

log = logging.getLogger(__name__)

# Creation, removal and renames change what exists; a closed-after-write changes a config
# file edited in place. Everything else (opens, attribute changes) is noise here.
_EVENTS = [
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileClosedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]
# The observer's dispatch thread wakes this often to check for stop; the daemon never
# stops it (it dies with the process), so wake it rarely: no polling while idle.
_DISPATCH_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class FsEvent:
    kind: str  # watchdog's event_type: created, deleted, moved, closed
    path: str
    dest_path: str
    is_directory: bool

    def paths(self) -> tuple[str, ...]:
        return (self.path, self.dest_path) if self.dest_path else (self.path,)


@dataclass(frozen=True)
class Watches:
    """Directories whose every event may matter, and quiet ones where only directories,
    sockets (``*.sock``) and the given ``files`` do: the kubelet rewrites its checkpoint in
    its plugin directory at every admission, and handling those events cost more CPU than
    the Allocate call itself. A directory that does not exist yet is watched through its
    nearest existing ancestor, so its making is seen."""

    dirs: frozenset[str] = frozenset()
    quiet_dirs: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()

    def __or__(self, other: Watches) -> Watches:
        return Watches(self.dirs | other.dirs, self.quiet_dirs | other.quiet_dirs, self.files | other.files)

    @property
    def quiet(self) -> frozenset[str]:
        """The quiet directories nobody watches in full."""
        return self.quiet_dirs - {nearest_existing(d) for d in self.dirs}


def matters(event: FsEvent, quiet: Collection[str], also: Collection[str] = ()) -> bool:
    """Whether a filesystem event can mean anything: in a ``quiet`` directory only
    directories, sockets and the files ``also`` do."""
    if event.is_directory:
        return True
    return any(os.path.dirname(p) not in quiet or p.endswith(".sock") or p in also for p in event.paths())


def removed_dirs(batch: Iterable[FsEvent]) -> list[str]:
    """Directories removed or renamed away: their watches must go."""
    return [e.path for e in batch if e.is_directory and e.kind in ("deleted", "moved")]


def touches(batch: Iterable[FsEvent], directory: str) -> bool:
    """Whether an event names a path directly in ``directory`` (a config file's, say)."""
    return any(os.path.dirname(p) == directory for e in batch for p in e.paths())


class _Forward(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, put: Callable[[FsEvent], None]) -> None:
        self._loop = loop
        self._put = put
        # Replaced whole (never changed in place) by the loop's thread, read on the observer's.
        self.quiet: frozenset[str] = frozenset()
        self.also: frozenset[str] = frozenset()

    def on_any_event(self, event: FileSystemEvent) -> None:
        fs_event = FsEvent(
            kind=event.event_type,
            path=os.fsdecode(event.src_path),
            dest_path=os.fsdecode(event.dest_path),
            is_directory=event.is_directory,
        )
        # Dropped here, on the observer's thread: the event loop is not even woken.
        if matters(fs_event, self.quiet, self.also):
            self._loop.call_soon_threadsafe(self._put, fs_event)


class Watcher:
    """Watches a set of directories, non-recursively, and can change the set at any time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, put: Callable[[FsEvent], None]) -> None:
        """``put`` receives every event that matters, on the loop's thread."""
        self._observer = InotifyObserver(timeout=_DISPATCH_TIMEOUT_S)
        self._observer.daemon = True
        self._handler = _Forward(loop, put)
        # Each watch is kept with the directory's identity: a directory removed and
        # made again under the same name needs a new inotify watch.
        self._watches: dict[str, tuple[ObservedWatch, tuple[int, int]]] = {}

    def start(self) -> None:
        self._observer.start()

    def watch(self, watches: Watches) -> None:
        self._handler.quiet, self._handler.also = watches.quiet, watches.files
        dirs = {nearest_existing(d) for d in watches.dirs | watches.quiet_dirs}
        for path, (watch, ident) in list(self._watches.items()):
            if path not in dirs or _identity(path) != ident:
                self._observer.unschedule(watch)
                del self._watches[path]
        for path in dirs - self._watches.keys():
            found = _identity(path)
            if found is None:
                continue
            try:
                watch = self._observer.schedule(self._handler, path, recursive=False, event_filter=_EVENTS)
            except OSError as exc:
                log.warning("cannot watch %s: %s", path, exc)
                continue
            self._watches[path] = (watch, found)

    def forget(self, removed: str) -> None:
        """Drops the watches of a removed directory and of everything below it.

        A directory made again under the name may get the old inode number back (ext4),
        so identity alone cannot tell the new one needs a watch of its own.
        """
        for path in [p for p in self._watches if p == removed or p.startswith(removed + "/")]:
            watch, _ = self._watches.pop(path)
            self._observer.unschedule(watch)

    def stop(self) -> None:
        """Drops every watch and ends the observer's threads, which close their inotify
        instances (unscheduling alone leaves one open per observer)."""
        self._observer.stop()


def _identity(path: str) -> tuple[int, int] | None:
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
