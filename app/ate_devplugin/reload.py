"""Reading the config file again: off the event loop, within a time bound, each failure told once."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ate_devplugin import config
from ate_devplugin.config import ConfigError, ResourceConfig, profile_warnings
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.tasks import Worker, WorkerBusyError

log = logging.getLogger(__name__)

T = TypeVar("T")
# What reads and judges the file: config.read_again's signature (tests give a slow one).
Check = Callable[[Path, str, bytes | None, str], tuple[bytes, tuple[ResourceConfig, ...] | ConfigError | None]]
# Reads that outlived the timeout and still run: each keeps a thread (Python cannot stop
# one). A later read gets a thread of its own, so a slow file never blocks the next one;
# past this many (a filesystem that hangs every read) reads are refused until one ends.
MAX_LEFT_RUNNING = 3


class ConfigReader:
    """Reads the file when asked; answers new resources only when they differ from the running ones.

    A file rejected (or unreadable) keeps the running config: counted, logged once for as
    long as it stays the same, and ``ate_devplugin_config_rejected`` is 1 meanwhile.

    New content is judged only once it stayed the same for ``settle_s``: a file written in
    place in several steps (a torn write) is seen half-written, and half a valid config is
    often valid (the first of two resources): applying it would restart what it left out.
    Its writer's last step brings another event, and the file is read again then.

    A read that times out is left to finish in its thread, its answer dropped: the next
    event's read runs beside it, so a valid file written after a slow one is applied on its
    own, without SIGHUP.
    """

    def __init__(
        self,
        path: Path,
        plugin_dir: str,
        metrics: Metrics,
        timeout_s: float,
        settle_s: float = 0.2,
        socket_suffix: str = "",
        check: Check = config.read_again,
    ) -> None:
        self.path = path
        self.plugin_dir = plugin_dir
        self.socket_suffix = socket_suffix
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self._check = check
        self._worker = Worker("config reload")
        self._left_running: list[threading.Event] = []  # set when that timed-out read ends
        self._data: bytes | None = None  # the file's bytes last read
        self._failures = SaidOnce()  # why the file could not be read, while it lasts

    async def read(self, running: tuple[ResourceConfig, ...]) -> tuple[ResourceConfig, ...] | None:
        """The file's resources if they differ from ``running``; None to keep them."""
        path, plugin_dir, previous, suffix = self.path, self.plugin_dir, self._data, self.socket_suffix
        check = self._check
        log.debug("reading the config file", extra={"path": str(path)})
        try:
            data, resources = await self._call(lambda: check(path, plugin_dir, previous, suffix))
            if resources is not None and self.settle_s:
                await asyncio.sleep(self.settle_s)
                if await self._call(lambda: config.read_config_file(path)) != data:
                    log.debug("the config file is still being written", extra={"path": str(path)})
                    return None
        except (ConfigError, TimeoutError, WorkerBusyError) as exc:
            self._data = None  # read it again next time, even if unchanged
            if self._failures.new(str(exc)):  # the same unreadable file is reported once
                self._rejected(exc)
            return None
        self._failures.over()
        if resources is None:
            return None  # unchanged, or the same rejected file seen again
        self._data = data
        if isinstance(resources, ConfigError):
            self._rejected(resources)
            return None
        self.metrics.config_rejected.set(0)
        if resources == running:
            return None
        for warning in profile_warnings(resources):
            log.warning("config reload: %s", warning)
        return resources

    async def _call(self, fn: Callable[[], T]) -> T:
        """``fn`` in the worker, within the timeout; one that times out is left running on
        its own thread, and the worker is a new one."""
        self._left_running = [ended for ended in self._left_running if not ended.is_set()]
        if len(self._left_running) >= MAX_LEFT_RUNNING:
            raise WorkerBusyError(f"{len(self._left_running)} earlier reads of the config file have not finished")
        ended = threading.Event()

        def run() -> T:
            try:
                return fn()
            finally:
                ended.set()

        try:
            return await self._worker.call(run, self.timeout_s)
        except TimeoutError:
            self._left_running.append(ended)
            self._worker = Worker("config reload")
            raise

    def reloaded(self, resources: tuple[ResourceConfig, ...]) -> None:
        self.metrics.config_reloads.labels("success").inc()
        log.info("config reloaded", extra={"resources": [r.name for r in resources]})

    def _rejected(self, why: Exception) -> None:
        self.metrics.config_reloads.labels("failure").inc()
        self.metrics.config_rejected.set(1)
        log.error("config reload rejected, keeping the running config: %s", why)
