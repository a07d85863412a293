import asyncio
from pathlib import Path

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin.config import DEFAULT_RESOURCES
from ate_devplugin.metrics import Metrics
from ate_devplugin.settings import resolve
from ate_devplugin.supervisor import AgentDiedError, Daemon, ResourceAgent
from ate_devplugin.tracing import Tracing
from tests.harness.devices import can_mknod, make_device_root
from tests.harness.require import require


async def test_an_agent_that_dies_ends_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require(can_mknod(), "mknod of a character device needs root")
    make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    settings = resolve({"device_root": str(tmp_path / "dev"), "plugin_dir": str(tmp_path / "plugins")}, {})

    async def broken(self: ResourceAgent) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(ResourceAgent, "_serve", broken)
    daemon = Daemon(settings, DEFAULT_RESOURCES, Metrics(CollectorRegistry()), Tracing(NoOpTracerProvider()))
    with pytest.raises(AgentDiedError):
        await asyncio.wait_for(daemon.run(asyncio.Event()), 30)
