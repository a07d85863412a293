"""Reading the config file again: off the event loop, within a time bound, each failure told once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ate_devplugin import config
from ate_devplugin.config import ConfigError, ResourceConfig
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.tasks import Worker, WorkerBusyError

log = logging.getLogger(__name__)


class ConfigReader:
    """Reads the file when asked; answers new resources only when they differ from the running ones.

    A file rejected (or unreadable) keeps the running config: counted, logged once for as
    long as it stays the same, and ``ate_devplugin_config_rejected`` is 1 meanwhile.

    New content is judged only once it stayed the same for ``settle_s``: a file written in
    place in several steps (a torn write) is seen half-written, and half a valid config is
    often valid (the first of two resources): applying it would restart what it left out.
    Its writer's last step brings another event, and the file is read again then.
    """

    def __init__(
        self,
        path: Path,
        plugin_dir: str,
        metrics: Metrics,
        timeout_s: float,
        settle_s: float = 0.2,
        socket_suffix: str = "",
    ) -> None:
        self.path = path
        self.plugin_dir = plugin_dir
        self.socket_suffix = socket_suffix
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self._worker = Worker("config reload")
        self._data: bytes | None = None  # the file's bytes last read
        self._failures = SaidOnce()  # why the file could not be read, while it lasts

    async def read(self, running: tuple[ResourceConfig, ...]) -> tuple[ResourceConfig, ...] | None:
        """The file's resources if they differ from ``running``; None to keep them."""
        path, plugin_dir, previous, suffix = self.path, self.plugin_dir, self._data, self.socket_suffix
        log.debug("reading the config file", extra={"path": str(path)})
        try:
            data, resources = await self._worker.call(
                lambda: config.read_again(path, plugin_dir, previous, suffix), self.timeout_s
            )
            if resources is not None and self.settle_s:
                await asyncio.sleep(self.settle_s)
                if await self._worker.call(lambda: config.read_config_file(path), self.timeout_s) != data:
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
        return None if resources == running else resources

    def reloaded(self, resources: tuple[ResourceConfig, ...]) -> None:
        self.metrics.config_reloads.labels("success").inc()
        log.info("config reloaded", extra={"resources": [r.name for r in resources]})

    def _rejected(self, why: Exception) -> None:
        self.metrics.config_reloads.labels("failure").inc()
        self.metrics.config_rejected.set(1)
        log.error("config reload rejected, keeping the running config: %s", why)
