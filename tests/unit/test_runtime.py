"""The composition root: serve in-process (signals stop or reload it; the probes answer
meanwhile; no root), and what device-plugin mode loads."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin import config, runtime
from ate_devplugin.host.cdi import CdiSpecs
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.observability.tracing import Tracing
from ate_devplugin.settings import RuntimeSettings, Settings, Timing, resolve
from tests.unit.dra.fakes import FakeApi

KVM_ONLY = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"
KVM_AND_TUN = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tun, devices: [/dev/net/tun]}]\n"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def settings_in(tmp_path: Path) -> Settings:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "dev").mkdir()
    (tmp_path / "config.yaml").write_text(KVM_ONLY)
    settings = resolve(
        {
            "device_root": str(tmp_path / "dev"),
            "plugin_dir": str(tmp_path / "plugins"),
            "metrics_address": "127.0.0.1:0",
            "config": str(tmp_path / "config.yaml"),
        },
        {},
    )
    return replace(settings, timing=Timing(shutdown_deadline_s=1.0, close_s=0.5))


async def logged(caplog: pytest.LogCaptureFixture, message: str, timeout: float = 10.0) -> logging.LogRecord:
    """The first record of ``message``, waiting for it (a bounded wait: a failure, not a hang)."""
    async with asyncio.timeout(timeout):
        while not (found := [r for r in caplog.records if r.getMessage() == message]):
            await asyncio.sleep(0.01)
    return found[0]


async def _serving(caplog: pytest.LogCaptureFixture, settings: Settings) -> tuple[asyncio.Task[None], str]:
    """``runtime.serve`` started with the file's resources, and the address of its probes."""
    part = settings.part(RuntimeSettings)
    serving = asyncio.create_task(runtime.serve(settings, config.load(part.config, part.plugin_dir)))
    return serving, "http://" + (await logged(caplog, "listening for metrics and probes")).__dict__["address"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2, signal.SIGQUIT])
def test_serve_stops_on_a_terminating_signal(tmp_path: Path, caplog: pytest.LogCaptureFixture, sig: int) -> None:
    settings = settings_in(tmp_path)
    answers: list[tuple[int, str]] = []

    async def main() -> None:
        serving, url = await _serving(caplog, settings)
        for path in ("/healthz", "/readyz"):
            answers.append(await asyncio.to_thread(get, f"{url}{path}"))
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(serving, 10)

    with caplog.at_level(logging.DEBUG, logger="ate_devplugin"):
        asyncio.run(main())
    # Alive, and ready: no device present, so nothing to wait for.
    assert answers == [(200, "ok\n"), (200, "ok: 0 of 1 resources present and registered\n")]
    messages = [r.getMessage() for r in caplog.records]
    assert "stopping" in messages
    assert "stopped" in messages
    assert any(getattr(r, "why", None) == signal.Signals(sig).name for r in caplog.records)


def test_sigusr1_writes_the_state_to_the_log_and_the_daemon_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_in(tmp_path)
    answers: list[tuple[int, str]] = []

    async def main() -> None:
        serving, url = await _serving(caplog, settings)
        try:
            await logged(caplog, "started")
            os.kill(os.getpid(), signal.SIGUSR1)
            await logged(caplog, "state")
            answers.append(await asyncio.to_thread(get, f"{url}/readyz"))
            assert not serving.done()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(serving, 10)

    with caplog.at_level(logging.DEBUG, logger="ate_devplugin"):
        asyncio.run(main())
    assert answers == [(200, "ok: 0 of 1 resources present and registered\n")]
    (record,) = [r for r in caplog.records if r.getMessage() == "state"]
    state = record.__dict__["state"]
    assert state["ready"] is True
    assert state["alive"] is True
    assert state["components"] == {
        "device plugin": "ok: 0 of 1 resources present and registered",
        "CDI specs": "ready",
        "kvm probe": "ready",
    }
    missing = "device node missing (/dev/kvm)"
    assert state["resources"] == {"ate.dev/kvm": {"devices": [], "complete": False, "health": missing}}
    assert state["config"] == str(tmp_path / "config.yaml")
    # Stopped by the SIGTERM that followed, not by SIGUSR1.
    assert [getattr(r, "why", None) for r in caplog.records if r.getMessage() == "stopping"] == ["SIGTERM"]


def test_sighup_reloads_the_config_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The file changed before the daemon watched it, so no event tells of it: only the
    signal makes the daemon read it, and serve its second resource."""
    settings = settings_in(tmp_path)
    answers: list[tuple[int, str]] = []

    async def main() -> None:
        part = settings.part(RuntimeSettings)
        resources = config.load(part.config, part.plugin_dir)
        (tmp_path / "config.yaml").write_text(KVM_AND_TUN)
        serving = asyncio.create_task(runtime.serve(settings, resources))
        try:
            url = "http://" + (await logged(caplog, "listening for metrics and probes")).__dict__["address"]
            await logged(caplog, "started")
            answers.append(await asyncio.to_thread(get, f"{url}/readyz"))
            os.kill(os.getpid(), signal.SIGHUP)
            await logged(caplog, "config reloaded")
            answers.append(await asyncio.to_thread(get, f"{url}/readyz"))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(serving, 10)

    with caplog.at_level(logging.DEBUG, logger="ate_devplugin"):
        asyncio.run(main())
    assert answers == [
        (200, "ok: 0 of 1 resources present and registered\n"),
        (200, "ok: 0 of 2 resources present and registered\n"),
    ]
    (reloaded,) = [r for r in caplog.records if r.getMessage() == "config reloaded"]
    assert reloaded.__dict__["resources"] == ["ate.dev/kvm", "ate.dev/tun"]


def test_device_plugin_mode_loads_no_kubernetes_client_nor_pod_reader_when_off() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ate_devplugin import cli, runtime\n"
        "from ate_devplugin.observability.metrics import Metrics\n"
        "from ate_devplugin.observability.tracing import setup_tracing\n"
        "from ate_devplugin.settings import resolve\n"
        "s, m, t = resolve({'pod_resources': 'off'}, {}), Metrics(), setup_tracing({})\n"
        "built = runtime.components(s, m, t, None)\n"
        "print([c.name for c in built])\n"
        "print(sorted(n for n in sys.modules if n.startswith(('lightkube', 'httpx', 'ate_devplugin.dra'))))\n"
        "print(sorted(n for n in sys.modules if 'podresources' in n))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == ["['kvm probe', 'device plugin', 'CDI specs']", "[]", "[]"]


@pytest.mark.parametrize(
    ("mode", "built"),
    [
        ("device-plugin", ["kvm probe", "device plugin", "CDI specs", "pod resources"]),
        ("both", ["kvm probe", "device plugin", "CDI specs", "DRA driver", "pod resources"]),
        ("dra", ["kvm probe", "CDI specs", "DRA driver", "pod resources"]),
    ],
)
def test_each_mode_builds_its_components(tmp_path: Path, mode: str, built: list[str]) -> None:
    flags = {"mode": mode, "pod_resources": "on", "plugin_dir": str(tmp_path / "plugins")}
    settings = resolve(flags, {"NODE_NAME": "n"})
    metrics, tracing = Metrics(CollectorRegistry()), Tracing(NoOpTracerProvider())
    dra = settings.part(RuntimeSettings).dra
    parts = runtime.components(settings, metrics, tracing, FakeApi() if dra else None)
    assert [c.name for c in parts] == built
    (specs,) = [c for c in parts if isinstance(c, CdiSpecs)]
    assert specs.every_resource is dra  # a DRA driver answers with CDI names only
