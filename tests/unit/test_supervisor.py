import asyncio
import os
import stat
from pathlib import Path

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin.config import DEFAULT_RESOURCES
from ate_devplugin.metrics import Metrics
from ate_devplugin.settings import resolve
from ate_devplugin.supervisor import AgentDiedError, Daemon, ResourceAgent
from ate_devplugin.tracing import Tracing


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
async def test_an_agent_that_dies_ends_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dev").mkdir()
    os.mknod(tmp_path / "dev/kvm", 0o600 | stat.S_IFCHR, os.makedev(10, 232))
    settings = resolve({"device_root": str(tmp_path / "dev"), "plugin_dir": str(tmp_path / "plugins")}, {})

    async def broken(self: ResourceAgent) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(ResourceAgent, "_serve", broken)
    daemon = Daemon(settings, DEFAULT_RESOURCES, Metrics(CollectorRegistry()), Tracing(NoOpTracerProvider()))
    with pytest.raises(AgentDiedError):
        await asyncio.wait_for(daemon.run(asyncio.Event()), 30)
