"""Filesystem events (inotify through watchdog), handed to the event loop in one place."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
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


class _Forward(FileSystemEventHandler):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, put: Callable[[FsEvent], None], keep: Callable[[FsEvent], bool]
    ) -> None:
        self._loop = loop
        self._put = put
        self._keep = keep

    def on_any_event(self, event: FileSystemEvent) -> None:
        fs_event = FsEvent(
            kind=event.event_type,
            path=os.fsdecode(event.src_path),
            dest_path=os.fsdecode(event.dest_path),
            is_directory=event.is_directory,
        )
        # Dropped here, on the observer's thread: the event loop is not even woken.
        if self._keep(fs_event):
            self._loop.call_soon_threadsafe(self._put, fs_event)


class Watcher:
    """Watches a set of directories, non-recursively, and can change the set at any time."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        put: Callable[[FsEvent], None],
        keep: Callable[[FsEvent], bool] = lambda _: True,
    ) -> None:
        """``put`` receives every event ``keep`` (called on the observer's thread) keeps,
        on the loop's thread."""
        self._observer = InotifyObserver(timeout=_DISPATCH_TIMEOUT_S)
        self._observer.daemon = True
        self._handler = _Forward(loop, put, keep)
        # Each watch is kept with the directory's identity: a directory removed and
        # made again under the same name needs a new inotify watch.
        self._watches: dict[str, tuple[ObservedWatch, tuple[int, int]]] = {}

    def start(self) -> None:
        self._observer.start()

    def watch(self, dirs: set[str]) -> None:
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
