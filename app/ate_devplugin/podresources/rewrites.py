"""The device manager's checkpoint rewritten: at most one wake-up per List.

The kubelet's device manager writes ``kubelet_internal_checkpoint`` anew, a temporary file
renamed over it, after every allocation and every device list a plugin sends. Heard
through the daemon's watcher, every rewrite was a batch for the supervisor to route (and
the devices discovered again), most of what attribution cost per admission. Here an
inotify descriptor of its own watches the plugin directory for a file renamed into it,
once (``IN_ONESHOT``): the first rename after a List asks for the next one, and the
rewrites until that List wake nothing. The List arms it again before it asks the kubelet,
so a rewrite the List may not show asks for one more. Whatever the descriptor says (the
rename, the watch ended with its directory, an overflow) asks for a List: nothing to decode.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable

from watchdog.observers.inotify_c import InotifyConstants, inotify_add_watch

from ate_devplugin.host.watcher import open_inotify
from ate_devplugin.observability.logs import SaidOnce

log = logging.getLogger(__name__)

_MASK = InotifyConstants.IN_MOVED_TO | InotifyConstants.IN_ONESHOT | InotifyConstants.IN_ONLYDIR
_READ_BYTES = 4096  # a few events at most between two reads


class Rewrites:
    """Calls ``wake`` (on the loop) at the first file renamed into ``directory`` after :meth:`arm`."""

    def __init__(self, directory: str, wake: Callable[[], None]) -> None:
        self.directory = directory
        self._wake = wake
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failures = SaidOnce()

    def start(self) -> None:
        self._fd = open_inotify()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._read)

    def arm(self) -> None:
        """Watch for the next rename (again: one watch per directory, the mask replaced).
        A directory that is not there is said once; the fallback interval lists meanwhile."""
        if self._fd < 0:
            return
        if inotify_add_watch(self._fd, os.fsencode(self.directory), _MASK) < 0:
            why = os.strerror(ctypes.get_errno())
            if self._failures.new(why):
                log.warning("cannot watch the kubelet's checkpoint: %s", why, extra={"directory": self.directory})
        elif self._failures.over():
            log.info("watching the kubelet's checkpoint again", extra={"directory": self.directory})

    def stop(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)  # ends the watch
            self._fd = -1

    def _read(self) -> None:
        try:
            while os.read(self._fd, _READ_BYTES):
                pass
        except BlockingIOError:
            pass
        self._wake()
