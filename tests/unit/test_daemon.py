"""The daemon with its real components on fake kubelet, clock and servers; real inotify on
temporary directories. With pods read: what makes it list again (a fake PodResources
server on a unix socket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin import runtime
from ate_devplugin.config import ResourceConfig, files
from ate_devplugin.daemon import Daemon
from ate_devplugin.deviceplugin.plugin import DevicePlugin
from ate_devplugin.host.cdi import CdiSpecs
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.observability.tracing import Tracing
from ate_devplugin.podresources.watch import PodResourcesWatch
from ate_devplugin.settings import (
    DaemonSettings,
    DevicePluginSettings,
    PodResourcesSettings,
    RuntimeSettings,
    Timing,
    resolve,
)
from ate_devplugin.tasks import Guard, TaskDiedError
from ate_devplugin.view import View
from tests.unit.dra.fakes import FakeApi
from tests.unit.fakes import KVM, FakeClock, FakeFs, FakeKubelet, FakeLister, FakeServer, fake_ports, pod, serve, until

KVM_ONLY = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"


KVM_AND_TUN = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tun, devices: [/dev/net/tun]}]\n"


def found(config: ResourceConfig, root: str) -> Discovery:
    """Every device present: /dev/kvm as KVM's 10:232, any other as 10:200."""
    return Discovery(
        nodes=tuple(DeviceNode(d, 10, 232 if d == "/dev/kvm" else 200) for d in config.devices), complete=True
    )


class Setup:
    def __init__(
        self,
        tmp_path: Path,
        config: str | None = None,
        flags: dict[str, str] | None = None,
        kube: FakeApi | None = None,  # the API server of a DRA mode
        **timing: float,
    ) -> None:
        (tmp_path / "plugins").mkdir()
        flags = {
            "device_root": str(tmp_path / "dev"),
            "plugin_dir": str(tmp_path / "plugins"),
            "cdi_dir": str(tmp_path / "cdi"),
            "kvm_probe": "off",  # nothing opens these nodes; tests/unit/kvmhealth probes
            **(flags or {}),
        }
        if config is not None:
            (tmp_path / "etc").mkdir()
            self.config = tmp_path / "etc/config.yaml"
            self.config.write_text(config)
            flags["config"] = str(self.config)
        settings = resolve(flags, {"NODE_NAME": "node-a"})
        self.settings = replace(settings, timing=Timing(agent_stop_s=0.5, server_stop_grace_s=0.0, **timing))
        part = self.settings.part(RuntimeSettings)
        resources = files.load(part.config, part.plugin_dir)
        self.kubelet_socket = self.settings.part(DevicePluginSettings).kubelet_socket
        self.fs = FakeFs(identities={self.kubelet_socket: (1, 1, 1)})
        self.kubelet = FakeKubelet()
        self.servers: dict[str, FakeServer] = {}
        self.metrics = Metrics(CollectorRegistry())
        self.daemon = runtime.build(
            self.settings,
            resources,
            self.metrics,
            Tracing(NoOpTracerProvider()),
            kube=kube,
            ports=fake_ports(self.fs, self.kubelet, FakeClock(), self.servers),
            discover=lambda config, root: self.discovered.get(config.name) or found(config, root),
        )
        self.discovered: dict[str, Discovery] = {}  # what discovery finds, when not the default
        # The kubelet opens its stream within each Register.
        self.kubelet.streams_of = lambda name: self.plugin.agents[name].state if name in self.plugin.agents else None

    @property
    def plugin(self) -> DevicePlugin:
        return next(c for c in self.daemon.components if isinstance(c, DevicePlugin))

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


async def running(s: Setup) -> asyncio.Task[None]:
    task = asyncio.create_task(s.daemon.run())
    await until(lambda: s.plugin.agents and all(a.serving for a in s.plugin.agents.values()), "ready")
    return task


async def test_runs_until_asked_to_stop(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    task = await running(s)
    assert s.daemon.readiness() == (True, "ok: 1 of 1 resources present and registered")
    assert s.daemon.liveness() == (True, "ok")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
    assert all(server.stops >= 1 for server in s.servers.values())


async def test_not_ready_while_not_registered(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.kubelet.outcomes = ["hang"]
    task = asyncio.create_task(s.daemon.run())
    await until(lambda: s.kubelet.calls == 1, "a hanging Register")
    ready, why = s.daemon.readiness()
    assert not ready
    assert "ate.dev/kvm" in why
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_kubelet_restart_is_counted_once_and_registers_again(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    task = await running(s)
    calls = s.kubelet.calls
    s.fs.identities[s.kubelet_socket] = (1, 2, 2)
    s.daemon.put(FsEvent("created", s.kubelet_socket, "", False))
    await until(lambda: s.kubelet.calls == calls + 1, "registered again")
    assert s.sample("ate_devplugin_kubelet_restarts_total") == 1
    # A chmod changes no identity (ctime is not part of it): no restart.
    s.daemon.put(FsEvent("created", s.kubelet_socket, "", False))
    await asyncio.sleep(0.05)
    assert s.sample("ate_devplugin_kubelet_restarts_total") == 1
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_config_reload_adds_and_removes_agents(tmp_path: Path) -> None:
    s = Setup(tmp_path, KVM_ONLY)
    task = await running(s)
    s.config.write_text(KVM_AND_TUN)
    await until(lambda: "ate.dev/tun" in s.plugin.agents, "tun added")
    assert s.sample("ate_devplugin_config_reloads_total", result="success") == 1
    s.daemon.request_reload()  # SIGHUP with nothing changed: nothing happens
    s.config.write_text(KVM_ONLY)
    # The agent leaves the table first; its series go once it has stopped.
    await until(
        lambda: (
            "ate.dev/tun" not in s.plugin.agents
            and s.sample("ate_devplugin_registered", resource_name="ate.dev/tun") is None
        ),
        "tun removed with its series",
    )
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


KVM_AND_TAP = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tap, devices: [/dev/net/tun]}]\n"


@pytest.mark.parametrize("mode", ["device-plugin", "dra", "both"])
async def test_a_reload_adds_renames_and_removes_a_resource_in_every_mode(tmp_path: Path, mode: str) -> None:
    """The KVM state told at a reload is rendered with the new resource list, never the old
    discovery (a KeyError in dra and both mode ended the daemon): every surface follows."""
    dra = mode != "device-plugin"
    dirs = {"registry_dir": str(tmp_path / "registry"), "dra_dir": str(tmp_path / "dra")} if dra else {}
    api = FakeApi() if dra else None
    s = Setup(tmp_path, KVM_ONLY, flags={"mode": mode, **dirs}, kube=api)
    task = asyncio.create_task(s.daemon.run())
    dp = mode != "dra"

    def surfaces() -> set[str]:
        """Every resource each surface has: the view, the agents, the slices' devices."""
        seen = {f"view {n}" for n in s.daemon.views.last}
        seen |= {f"agent {n}" for n in s.plugin.agents} if dp else set()
        seen |= {f"slice {d.rsplit('-', 1)[0] if d[-1].isdigit() else d}" for d in api.devices()} if api else set()
        return seen

    def reloaded() -> float | None:
        return s.sample("ate_devplugin_config_reloads_total", result="success")

    def on_every_surface(*names: str) -> set[str]:
        kinds = ["view", *(["agent"] if dp else []), *(["slice"] if dra else [])]
        return {
            f"{kind} {n if kind != 'slice' else n.replace('.', '-').replace('/', '-')}" for kind in kinds for n in names
        }

    try:
        await until(lambda: surfaces() == on_every_surface("ate.dev/kvm"), "kvm served")
        for config, names, reloads in (
            (KVM_AND_TUN, ("ate.dev/kvm", "ate.dev/tun"), 1),  # added
            (KVM_AND_TAP, ("ate.dev/kvm", "ate.dev/tap"), 2),  # renamed
            (KVM_ONLY, ("ate.dev/kvm",), 3),  # removed
        ):
            s.config.write_text(config)
            await until(
                lambda n=reloads: s.sample("ate_devplugin_config_reloads_total", result="success") == n, "reloaded"
            )
            await until(lambda n=names: surfaces() == on_every_surface(*n), f"every surface has {names}")
            assert not task.done(), "the daemon runs"
        kvm = s.daemon.views.last["ate.dev/kvm"]
        assert kvm.kvm is not None, "its KVM state kept through the reloads"
        assert kvm.healthy
        # The resources that left the config left every series too.
        labelled = {
            sample.labels["resource_name"]
            for metric in s.metrics.registry.collect()
            for sample in metric.samples
            if "resource_name" in sample.labels
        }
        assert labelled == {"ate.dev/kvm"}
    finally:
        s.daemon.request_stop("SIGTERM")
        await asyncio.wait_for(task, 5)


async def test_a_rejected_reload_keeps_the_running_config(tmp_path: Path) -> None:
    s = Setup(tmp_path, KVM_ONLY)
    task = await running(s)
    s.config.write_text("resources: [{name: ate.dev/kvm, units: many}]\n")
    await until(lambda: s.sample("ate_devplugin_config_reloads_total", result="failure") == 1, "rejected")
    assert list(s.plugin.agents) == ["ate.dev/kvm"]
    assert s.daemon.readiness()[0]
    assert s.sample("ate_devplugin_config_rejected") == 1
    # Back to the running config: nothing to reload, and nothing rejected any more.
    s.config.write_text(KVM_ONLY)
    await until(lambda: s.sample("ate_devplugin_config_rejected") == 0, "rejection cleared")
    assert s.sample("ate_devplugin_config_reloads_total", result="success") == 0
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


TORN = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}, {name: ate.dev/tun, devices: [/dev/net/"


@pytest.mark.parametrize("torn", ["", TORN, KVM_ONLY], ids=["truncated", "invalid", "valid"])
async def test_a_torn_write_restarts_nothing(tmp_path: Path, torn: str) -> None:
    """The file written in place in two steps: its first part (valid or not) is never
    judged, so the unchanged resources keep their agents and nothing is counted."""
    s = Setup(tmp_path, KVM_AND_TUN)
    task = await running(s)
    agents = dict(s.plugin.agents)
    with s.config.open("w") as f:  # truncated, and the first part written (closed: an event)
        f.write(torn)
    await asyncio.sleep(0.05)
    with s.config.open("w") as f:
        f.write(KVM_AND_TUN)
    await asyncio.sleep(s.settings.timing.reload_settle_s * 3)
    assert s.plugin.agents == agents
    assert s.kubelet.calls == 2  # one registration each
    assert s.sample("ate_devplugin_config_reloads_total", result="failure") == 0
    assert s.sample("ate_devplugin_config_reloads_total", result="success") == 0
    s.config.write_text(KVM_ONLY)  # a real change is applied, once settled
    await until(lambda: "ate.dev/tun" not in s.plugin.agents, "tun removed")
    assert s.plugin.agents["ate.dev/kvm"] is agents["ate.dev/kvm"]
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_reload_that_hangs_is_rejected_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Setup(tmp_path, KVM_ONLY, reload_timeout_s=0.2)
    task = await running(s)

    def slow_read(path: Path) -> bytes:
        time.sleep(1)
        return b""

    monkeypatch.setattr(files, "read_config_file", slow_read)
    s.daemon.request_reload()
    await until(lambda: s.sample("ate_devplugin_config_reloads_total", result="failure") == 1, "timed out")
    monkeypatch.undo()
    assert s.daemon.reader is not None
    s.daemon.reader.timeout_s = 30  # the valid file's read is not raced against the clock
    s.config.write_text(KVM_AND_TUN)
    s.daemon.request_reload()  # the hanging read still runs: this one has a thread of its own
    await until(lambda: s.sample("ate_devplugin_config_reloads_total", result="success") == 1, "applied")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_stall_fails_liveness_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Setup(tmp_path, KVM_ONLY, event_deadline_s=0.1, reload_timeout_s=30)
    task = await running(s)
    release = asyncio.Event()

    async def stuck(reader: object) -> None:
        await release.wait()

    monkeypatch.setattr(s.daemon, "_reload", stuck)
    s.daemon.request_reload()
    await until(lambda: not s.daemon.liveness()[0], "liveness fails")
    assert "event_handling" in s.daemon.liveness()[1]
    assert s.sample("ate_devplugin_lifecycle_stalls_total", reason="event_handling") == 1
    release.set()
    await until(lambda: s.daemon.liveness()[0], "alive again once events flow")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_stop_is_bounded_even_mid_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(tmp_path, KVM_ONLY, shutdown_deadline_s=1.0)
    task = await running(s)
    entered, released = asyncio.Event(), asyncio.Event()

    async def wedged(reader: object) -> None:  # a handler that ignores cancellation, as a wedged one would
        entered.set()
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await released.wait()

    monkeypatch.setattr(s.daemon, "_reload", wedged)
    s.daemon.request_reload()
    await asyncio.wait_for(entered.wait(), 5)
    s.daemon.request_stop("SIGTERM")
    # It stops though the handler never ends: the wait is a hang bound, not a speed one.
    await asyncio.wait_for(task, 60)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown deadline passed")]
    assert line.startswith("shutdown deadline passed; still running: event router")
    released.set()  # the wedged handler ends, and with it the agents' late stops
    await until(lambda: all(server.stops >= 1 for server in s.servers.values()), "the agents stopped late")


async def test_an_agent_that_dies_ends_the_daemon(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.servers["ate.dev/kvm"] = FakeServer("/plugins/kvm.sock", crash=True)
    with pytest.raises(TaskDiedError, match=r"ate\.dev/kvm"):
        await asyncio.wait_for(s.daemon.run(), 5)


CDI_KVM_AND_TUN = (
    "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], allocate: cdi, cdi: {file_mode: '0666'}},"
    " {name: ate.dev/tun, devices: [/dev/net/tun], allocate: both}]\n"
)


async def test_cdi_specs_follow_the_devices_and_the_config(tmp_path: Path) -> None:
    s = Setup(tmp_path, CDI_KVM_AND_TUN)
    kvm, tun = tmp_path / "cdi/ate.dev-kvm.json", tmp_path / "cdi/ate.dev-tun.json"
    task = await running(s)
    assert json.loads(kvm.read_text())["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232, "permissions": "rw", "fileMode": 438}
    ]
    assert tun.exists()

    # A node appears: the spec carries it after the next discovery.
    two = (DeviceNode("/dev/kvm", 10, 232), DeviceNode("/dev/kvm2", 10, 201))
    s.discovered["ate.dev/kvm"] = Discovery(nodes=two, complete=True)
    s.daemon.put(FsEvent("created", str(tmp_path / "dev/kvm2"), "", False))
    await until(lambda: len(json.loads(kvm.read_text())["devices"][0]["containerEdits"]["deviceNodes"]) == 2, "2 nodes")

    # tun answers with device specs now, and kvm leaves the config: both specs go.
    s.config.write_text("resources: [{name: ate.dev/tun, devices: [/dev/net/tun]}]\n")
    await until(lambda: not kvm.exists() and not tun.exists(), "specs removed")
    assert (
        s.sample("ate_devplugin_cdi_spec_updates_total", resource_name="ate.dev/tun", action="remove", result="success")
        == 1
    )

    s.config.write_text(CDI_KVM_AND_TUN)
    await until(lambda: kvm.exists() and tun.exists(), "specs written again")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
    assert sorted(os.listdir(tmp_path / "cdi")) == []  # removed on a clean stop


async def test_without_cdi_no_spec_is_written(tmp_path: Path) -> None:
    s = Setup(tmp_path, KVM_ONLY)
    task = await running(s)
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
    assert not (tmp_path / "cdi").exists()


async def test_a_spec_for_every_resource_when_asked(tmp_path: Path) -> None:
    # Each test has its own tmp_path: a subdirectory could take the plugin socket's path
    # past the 107-byte limit under a long TMPDIR (make unit-nonroot).
    s = Setup(tmp_path, KVM_ONLY)
    (specs,) = [c for c in s.daemon.components if isinstance(c, CdiSpecs)]
    specs.every_resource = True  # as with a DRA driver
    task = await running(s)
    assert json.loads((tmp_path / "cdi/ate.dev-kvm.json").read_text())["kind"] == "ate.dev/kvm"
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
    assert not (tmp_path / "cdi/ate.dev-kvm.json").exists()


class Pods:
    def __init__(self, tmp_path: Path, setup: Setup, lister: FakeLister, server: grpc.aio.Server) -> None:
        self.s = setup
        self.lister = lister
        self.server = server
        self.plugins = tmp_path / "plugins"

    def write_checkpoint(self) -> None:
        """As the kubelet's device manager does: a temporary file renamed over it."""
        tmp = self.plugins / ".tmp-checkpoint"
        tmp.write_text("{}")
        os.rename(tmp, self.plugins / "kubelet_internal_checkpoint")


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[Pods]:
    (tmp_path / "pod-resources").mkdir()
    lister = FakeLister()
    lister.pods = [pod("vm", "worker", ("vmm", KVM, 1))]
    server = await serve(tmp_path / "pod-resources/kubelet.sock", lister)
    flags = {"pod_resources": "on", "pod_resources_interval": "0"}
    setup = Setup(tmp_path, flags=flags, pod_resources_debounce_s=0.0, pod_resources_gap_s=0.0)
    try:
        yield Pods(tmp_path, setup, lister, server)
    finally:
        await server.stop(None)


def units(s: Setup, pod_name: str) -> float | None:
    return s.sample("ate_devplugin_pod_units", resource_name=KVM, namespace="vm", pod=pod_name, container="vmm")


async def test_the_checkpoint_written_lists_again(pods: Pods) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    viewed = s.daemon.views.last
    pods.lister.pods.append(pod("vm", "new", ("vmm", KVM, 1)))
    pods.write_checkpoint()
    await until(lambda: units(s, "new") == 1, "a List after the checkpoint was written")
    # Heard by the PodResources watch alone: no batch for the daemon, no discovery.
    assert s.daemon.views.last is viewed
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_new_pod_resources_socket_is_dialled(pods: Pods) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    calls = pods.lister.calls
    s.daemon.put(FsEvent("created", s.settings.part(PodResourcesSettings).pod_resources_socket, "", False))
    await until(lambda: pods.lister.calls > calls, "a List on the new socket")
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_a_lost_device_counts_and_names_the_pods_holding_it(pods: Pods, caplog: pytest.LogCaptureFixture) -> None:
    s = pods.s
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    assert s.sample("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0

    s.discovered[KVM] = Discovery(nodes=(), complete=False)
    s.daemon.put(FsEvent("deleted", "/dev/kvm", "", False))
    await until(lambda: s.sample("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 1, "counted")
    await until(lambda: any(r.message.startswith("device lost") for r in caplog.records), "logged")
    (line,) = [r for r in caplog.records if r.message.startswith("device lost")]
    assert line.levelno == logging.WARNING
    assert line.__dict__["pods"] == ["vm/worker"]
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


class SlowStart:
    """A component whose start yields to the loop for a while (as the DRA driver's does,
    serving its sockets): tasks started before it run meanwhile."""

    name = "slow start"

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        await asyncio.sleep(0.1)

    async def stop(self, deadline_s: float) -> list[str]:
        return []

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        pass

    def on_view(self, view: View) -> None:
        pass


async def test_the_first_list_follows_the_first_discovery_whatever_the_start_order(pods: Pods) -> None:
    """Started after the watch, a start that yields does not make the watch list before it
    knows which devices are present: one List, after the first discovery, with every series."""
    s = pods.s
    s.daemon.components.append(SlowStart())
    task = await running(s)
    await until(lambda: units(s, "worker") == 1, "the first List")
    assert s.sample("ate_devplugin_pods_holding_units", resource_name=KVM) == 1
    assert s.sample("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0
    assert pods.lister.calls == 1
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


async def test_on_by_default_and_off_reads_no_pods(tmp_path: Path) -> None:
    (tmp_path / "default").mkdir()
    (tmp_path / "off").mkdir()
    assert [c for c in Setup(tmp_path / "default").daemon.components if isinstance(c, PodResourcesWatch)]
    s = Setup(tmp_path / "off", flags={"pod_resources": "off"})
    task = await running(s)
    assert not [c for c in s.daemon.components if isinstance(c, PodResourcesWatch)]
    assert s.sample("ate_devplugin_pod_resources_requests_total", result="unavailable") is None
    s.daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)


class Probe:
    """A component that only answers, and may start a task that dies."""

    def __init__(self, name: str, ready: tuple[bool, str], dies: bool = False) -> None:
        self.name = name
        self.ready = ready
        self.dies = dies
        self.heard: list[str] = []

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        async def fails() -> None:
            raise RuntimeError("injected")

        if self.dies:
            guard.spawn("slice_sync", fails(), f"{self.name} task")

    async def stop(self, deadline_s: float) -> list[str]:
        self.heard.append("stop")
        return []

    def readiness(self) -> tuple[bool, str]:
        return self.ready

    def liveness(self) -> tuple[bool, str]:
        return True, ""

    def watches(self) -> Watches:
        return Watches()

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        self.heard.append("events")

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self.heard.append("resources")

    def on_view(self, view: View) -> None:
        self.heard.append("view")


def probe_daemon(tmp_path: Path, *probes: Probe) -> Daemon:
    settings = Setup(tmp_path).settings
    return Daemon(settings.part(DaemonSettings), (), probes, Metrics(CollectorRegistry()), discover=found)


async def test_readiness_waits_for_every_component_and_joins_what_they_say(tmp_path: Path) -> None:
    a, b = Probe("a", (True, "a ok")), Probe("b", (False, "b not yet"))
    daemon = probe_daemon(tmp_path, a, b)
    assert daemon.readiness() == (False, "b not yet")
    b.ready = (True, "")
    assert daemon.readiness() == (True, "a ok")
    a.ready = (True, "")
    assert daemon.readiness() == (True, "ok")


async def test_any_components_task_that_dies_ends_the_daemon_counted(tmp_path: Path) -> None:
    probe = Probe("slices", (True, ""), dies=True)
    daemon = probe_daemon(tmp_path, probe)
    with pytest.raises(TaskDiedError, match="slices task died"):
        await asyncio.wait_for(daemon.run(), 5)
    assert daemon.metrics.registry.get_sample_value("ate_devplugin_task_failures_total", {"task": "slice_sync"}) == 1
    assert probe.heard == ["view", "stop"]


class SocketMaker(Probe):
    """Asks for its socket to be watched from its first discovery on, as the device plugin
    does for the socket an agent then makes."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__("maker", (True, ""))
        self.socket_path = socket_path
        self.present = False
        self.seen: list[FsEvent] = []

    def watches(self) -> Watches:
        return Watches(sockets=frozenset({str(self.socket_path)} if self.present else ()))

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        self.seen += batch

    def on_view(self, view: View) -> None:
        self.present = True


async def test_what_a_discovery_makes_a_component_watch_is_watched_at_once(tmp_path: Path) -> None:
    maker = SocketMaker(tmp_path / "plugins" / "later.sock")
    daemon = probe_daemon(tmp_path, maker)
    task = asyncio.create_task(daemon.run())
    await until(lambda: maker.present, "the first discovery")
    # Made with no other event to follow: its making is seen all the same.
    with socket.socket(socket.AF_UNIX) as made:
        made.bind(str(maker.socket_path))
        await until(lambda: FsEvent("created", str(maker.socket_path), "", False) in maker.seen, "made")
    daemon.request_stop("SIGTERM")
    await asyncio.wait_for(task, 5)
