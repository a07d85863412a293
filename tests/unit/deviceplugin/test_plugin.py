"""The device-plugin component with fake ports: what it says while the kubelet is away."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin.deviceplugin.plugin import DevicePlugin
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.settings import DevicePluginSettings, resolve
from tests.unit.fakes import FakeClock, FakeFs, FakeKubelet, fake_ports

KUBELET = "/plugins/kubelet.sock"
SETTINGS = resolve({"plugin_dir": "/plugins"}, {}).part(DevicePluginSettings)


def test_the_plugin_says_where_it_waits_for_the_kubelet_at_info_once_then_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before any device is present (no agent serves yet): a wrong --plugin-dir shows at once."""
    fs = FakeFs()
    ports = fake_ports(fs, FakeKubelet(), FakeClock(), {})
    plugin = DevicePlugin(SETTINGS, ports, Metrics(CollectorRegistry()), NoOpTracerProvider().get_tracer("test"))
    caplog.set_level(logging.DEBUG, logger="ate_devplugin.deviceplugin.plugin")

    def said() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if "kubelet socket" in r.getMessage()]

    for _ in range(3):
        plugin.on_view({})  # what every batch of events ends with
    waiting = f"waiting for the kubelet socket at {KUBELET}"
    assert said() == [(logging.INFO, waiting), (logging.DEBUG, waiting), (logging.DEBUG, waiting)]
    caplog.clear()
    fs.identities[KUBELET] = (1, 2, 3)
    plugin.on_view({})
    del fs.identities[KUBELET]  # gone again (a kubelet restarting): said at info again, once
    plugin.on_view({})
    plugin.on_view({})
    assert said() == [(logging.INFO, "kubelet socket appeared"), (logging.INFO, waiting), (logging.DEBUG, waiting)]
