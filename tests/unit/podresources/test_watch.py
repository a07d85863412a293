"""The PodResources watch against a fake PodResources server on a unix socket (the real
kubelet's is in tests/kubelet/test_pod_resources_dra.py and tests/e2e/test_pods_holding_units.py).
And what filesystem events ask for a List."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.metrics import PodResourcesMetrics
from ate_devplugin.podresources import watch
from ate_devplugin.podresources.rewrites import Rewrites
from ate_devplugin.podresources.watch import DraDevices, PodResourcesWatch, asks_for_list
from ate_devplugin.settings import PodResourcesSettings
from ate_devplugin.tasks import Guard
from ate_devplugin.view import View, build
from tests.unit.fakes import KVM, TUN, FakeLister, claimed, pod, serve, until

PRESENT = Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True)
ABSENT = Discovery(nodes=(), complete=False)
RESOURCES = (ResourceConfig(name=KVM, devices=("/dev/kvm",)), ResourceConfig(name=TUN, devices=("/dev/net/tun",)))


def view(found: dict[str, Discovery]) -> View:
    """The daemon's view of the resources ``found`` holds."""
    return build(tuple(r for r in RESOURCES if r.name in found), found, {})


class Setup:
    def __init__(
        self,
        tmp_path: Path,
        tracer: Any = None,
        interval_s: float = 0.0,
        cause: Context | None = None,
        dra: DraDevices | None = None,
    ) -> None:
        self.socket = tmp_path / "kubelet.sock"
        self.plugin_dir = tmp_path / "device-plugins"
        self.plugin_dir.mkdir()
        self.lister = FakeLister()
        self.registry = CollectorRegistry()
        settings = PodResourcesSettings(
            str(self.socket), interval_s, 0.0, 0.0, 5.0, plugin_dir=str(self.plugin_dir), mode="both"
        )
        self.watch = PodResourcesWatch(
            settings, PodResourcesMetrics(self.registry), tracer or NoOpTracer(), cause_of=lambda r: cause, dra=dra
        )
        self.guard = Guard(lambda name, error: None)
        self.found = {KVM: PRESENT}

    async def start(self) -> None:
        """Started, and shown the first view (KVM present), as the daemon does."""
        await self.watch.start(RESOURCES, self.guard)
        self.watch.on_view(view(self.found))

    def discovered(self, **found: Discovery) -> None:
        """The next discovery: ``kvm=ABSENT``, ``tun=PRESENT`` (the others as before)."""
        self.found.update({f"ate.dev/{name}": d for name, d in found.items()})
        self.watch.on_view(view(self.found))

    def units(self, namespace: str, name: str, container: str, resource: str = KVM) -> float | None:
        labels = {"resource_name": resource, "namespace": namespace, "pod": name, "container": container}
        return self.registry.get_sample_value("ate_devplugin_pod_units", labels)

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    s = Setup(tmp_path)
    server = await serve(s.socket, s.lister)
    await s.watch.on_resources(RESOURCES)  # unstarted: lists only when a test asks
    s.watch.on_view(view(s.found))
    try:
        yield s
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_series_follow_the_pods_that_hold_units(setup: Setup) -> None:
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "b", ("vmm", KVM, 1), ("helper", KVM, 2))]
    await setup.watch.list_once()
    assert setup.units("vm", "a", "vmm") == 1
    assert setup.units("vm", "b", "helper") == 2
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 2
    assert setup.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0
    assert setup.value("ate_devplugin_pod_resources_requests_total", result="success") == 1
    assert setup.value("ate_devplugin_pod_resources_duration_seconds_count") == 1

    setup.lister.pods = [pod("vm", "b", ("vmm", KVM, 1))]  # a deleted, b's helper ended
    await setup.watch.list_once()
    assert setup.units("vm", "a", "vmm") is None
    assert setup.units("vm", "b", "helper") is None
    assert setup.units("vm", "b", "vmm") == 1
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 1

    # Only what changed is set again: a changed count, and a series gone and back.
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "b", ("vmm", KVM, 3))]
    await setup.watch.list_once()
    assert setup.units("vm", "a", "vmm") == 1
    assert setup.units("vm", "b", "vmm") == 3
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 2


async def test_series_are_bounded_and_what_is_dropped_is_counted(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "MAX_SERIES", 3)
    setup.lister.pods = [pod("vm", f"p{i}", ("vmm", KVM, 1)) for i in range(5)]
    await setup.watch.list_once()
    assert [setup.units("vm", f"p{i}", "vmm") for i in range(5)] == [1, 1, 1, None, None]
    assert setup.value("ate_devplugin_pod_units_series_dropped") == 2
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 5  # every pod counted

    setup.lister.pods = setup.lister.pods[1:3]
    await setup.watch.list_once()
    assert [setup.units("vm", f"p{i}", "vmm") for i in range(5)] == [None, 1, 1, None, None]
    assert setup.value("ate_devplugin_pod_units_series_dropped") == 0


async def test_device_loss_counts_the_pods_names_them_in_a_log_line_and_a_span_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    s = Setup(tmp_path, tracer=provider.get_tracer("test"))
    server = await serve(s.socket, s.lister)
    try:
        s.lister.pods = [pod("vm", "a", ("vmm", KVM, 1)), pod("vm", "b", ("vmm", KVM, 1))]
        await s.start()
        await until(lambda: s.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 2, "first List")
        calls = s.lister.calls

        s.discovered(kvm=ABSENT)
        # At once, from the pods last listed ...
        assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 2
        # ... and reported with those of a new List.
        await until(lambda: any(r.message.startswith("device lost") for r in caplog.records), "the loss logged")
        assert s.lister.calls > calls
        (record,) = [r for r in caplog.records if r.message.startswith("device lost")]
        assert record.levelno == logging.WARNING
        assert record.message == "device lost while pods hold its units: vm/a, vm/b"
        assert record.__dict__["pods"] == ["vm/a", "vm/b"]
        assert record.__dict__["resource"] == KVM
        (listing,) = [sp for sp in exporter.get_finished_spans() if sp.events]
        assert listing.name == "v1.PodResourcesLister/List"
        (event,) = listing.events
        assert event.name == "device lost"
        assert event.attributes is not None
        assert list(event.attributes["ate_devplugin.pods"]) == ["vm/a", "vm/b"]  # type: ignore[arg-type]
        assert event.attributes["ate_devplugin.pod_count"] == 2

        s.discovered(kvm=PRESENT)
        assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_the_loss_is_a_child_of_the_device_change(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("device change") as change:
        cause = context.get_current()
    s = Setup(tmp_path, tracer=tracer, cause=cause)
    server = await serve(s.socket, s.lister)
    try:
        await s.watch.on_resources(RESOURCES)
        s.discovered()
        s.discovered(kvm=ABSENT)
        await s.watch.list_once()
        (listing,) = [sp for sp in exporter.get_finished_spans() if sp.name.endswith("/List")]
        assert listing.parent is not None
        assert listing.parent.span_id == change.get_span_context().span_id
        assert listing.events[0].attributes == {
            "ate_devplugin.resource_name": KVM,
            "ate_devplugin.pods": (),
            "ate_devplugin.pod_count": 0,
        }
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_failures_are_counted_logged_once_and_the_next_list_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ate_devplugin")
    s = Setup(tmp_path)
    await s.watch.on_resources(RESOURCES)
    try:
        await s.watch.list_once()  # no socket yet
        await s.watch.list_once()
        assert s.value("ate_devplugin_pod_resources_requests_total", result="unavailable") == 2
        warnings = [r for r in caplog.records if r.message.startswith("cannot list pod resources")]
        assert len(warnings) == 1
        assert warnings[0].message.endswith("no such socket")

        stale = socket.socket(socket.AF_UNIX)  # a socket file nobody listens on
        stale.bind(str(s.socket))
        stale.close()
        await s.watch.list_once()
        assert s.value("ate_devplugin_pod_resources_requests_total", result="unavailable") == 3
        assert "UNAVAILABLE" in caplog.records[-1].message
        s.socket.unlink()

        server = await serve(s.socket, s.lister)
        try:
            s.lister.fail = grpc.StatusCode.RESOURCE_EXHAUSTED  # the kubelet's rate limit
            await s.watch.list_once()
            assert s.value("ate_devplugin_pod_resources_requests_total", result="error") == 1
            s.lister.fail = None
            s.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
            await s.watch.list_once()
            assert s.units("vm", "a", "vmm") == 1
            assert any(r.message == "PodResources answers again" for r in caplog.records)
        finally:
            await server.stop(None)
    finally:
        await s.watch.stop(1.0)


async def test_a_loss_seen_while_the_kubelet_does_not_answer_is_reported_by_the_next_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ate_devplugin")
    s = Setup(tmp_path)
    try:
        s.discovered()
        s.discovered(kvm=ABSENT)
        await s.watch.list_once()  # no socket
        assert not any(r.message.startswith("device lost") for r in caplog.records)
        server = await serve(s.socket, s.lister)
        try:
            await s.watch.list_once()
            assert any(r.message == "device lost; no pod holds its units" for r in caplog.records)
        finally:
            await server.stop(None)
    finally:
        await s.watch.stop(1.0)


async def test_a_device_absent_from_the_start_is_no_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ate_devplugin")
    s = Setup(tmp_path)
    server = await serve(s.socket, s.lister)
    try:
        s.discovered(kvm=ABSENT)
        await s.watch.list_once()
        assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0  # nobody holds it
        assert not any(r.message.startswith("device lost") for r in caplog.records)
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_the_first_list_waits_for_the_first_discovery(tmp_path: Path) -> None:
    s = Setup(tmp_path, interval_s=3600)
    server = await serve(s.socket, s.lister)
    try:
        await s.watch.start(RESOURCES, s.guard)
        await asyncio.sleep(0.05)
        assert s.lister.calls == 0
        s.discovered()
        await until(lambda: s.lister.calls == 1, "the first List")
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_without_events_the_fallback_interval_lists_again(tmp_path: Path) -> None:
    s = Setup(tmp_path, interval_s=0.05)
    server = await serve(s.socket, s.lister)
    try:
        await s.start()
        await until(lambda: s.lister.calls >= 3, "Lists on the interval")
        s.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
        await until(lambda: s.units("vm", "a", "vmm") == 1, "the pod seen on the interval")
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_requests_are_coalesced(setup: Setup) -> None:
    setup.watch.gap_s = 0.2
    await setup.start()
    await until(lambda: setup.lister.calls == 1, "the first List")
    for _ in range(20):
        setup.watch.refresh()
    await until(lambda: setup.lister.calls == 2, "one more List for all of them")
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
    setup.watch.refresh()
    await until(lambda: setup.units("vm", "a", "vmm") == 1, "a List for the next request")
    assert setup.lister.calls == 3


async def test_series_of_a_resource_no_longer_served_go(setup: Setup) -> None:
    setup.discovered(tun=PRESENT)
    setup.lister.pods = [pod("vm", "a", ("vmm", TUN, 1))]
    await setup.watch.list_once()
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=TUN) == 1
    await setup.watch.on_resources(RESOURCES[:1])
    setup.watch.on_view(view({KVM: PRESENT}))  # the view after a reload: tun is gone
    await setup.watch.list_once()
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=TUN) is None
    assert setup.value("ate_devplugin_pods_on_unhealthy_device", resource_name=TUN) is None
    assert setup.units("vm", "a", "vmm", TUN) is None


async def test_stop_before_start_and_twice_is_safe(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    await s.watch.stop(1.0)
    await s.watch.start((), s.guard)
    await s.watch.stop(1.0)
    await s.watch.stop(1.0)
    assert s.watch.task is not None
    assert s.watch.task.cancelled()


async def test_an_unexpected_error_is_logged_and_the_next_request_lists_again(
    setup: Setup, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = {"once": True}
    wanted_now = setup.watch._wanted_now

    def fails_once() -> Any:
        if broken.pop("once", False):
            raise RuntimeError("injected")
        return wanted_now()

    monkeypatch.setattr(setup.watch, "_wanted_now", fails_once)
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
    await setup.start()
    await until(lambda: any(r.message == "listing pod resources failed" for r in caplog.records), "logged")
    assert setup.value("ate_devplugin_pod_resources_requests_total", result="error") == 1
    setup.watch.refresh()
    await until(lambda: setup.units("vm", "a", "vmm") == 1, "listed again")


async def test_no_pod_counts_before_a_list_answered(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.discovered()
    s.discovered(kvm=ABSENT)
    await s.watch.list_once()  # no socket
    assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) is None
    assert s.value("ate_devplugin_pods_holding_units", resource_name=KVM) is None
    await s.watch.stop(1.0)


# --- DRA: claims the kubelet reports, counted by our driver's devices ------------------------

DRIVER = "ate.dev"
DEVICES = {"ate-dev-kvm": KVM, "ate-dev-kvm-0": KVM, "ate-dev-kvm-1": KVM, "ate-dev-tun": TUN}


async def test_claims_of_our_driver_count_as_units_and_a_loss_names_their_pods(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(tmp_path, dra=DraDevices(DRIVER, lambda: DEVICES))
    server = await serve(s.socket, s.lister)
    try:
        s.lister.pods = [
            claimed("vm", "a", "vmm", ("a-kvm", DRIVER, "ate-dev-kvm")),
            claimed("vm", "b", "vmm", ("b-kvm", DRIVER, "ate-dev-kvm-0"), ("b-kvm", DRIVER, "ate-dev-kvm-1")),
            claimed("gpu", "c", "main", ("c-gpu", "gpu.example.com", "ate-dev-kvm")),  # not our driver
            claimed("vm", "d", "vmm", ("d-x", DRIVER, "unknown-device")),  # not a device of ours
        ]
        await s.start()
        await until(lambda: s.units("vm", "b", "vmm") == 2, "the claims counted")
        assert s.units("vm", "a", "vmm") == 1
        assert s.units("gpu", "c", "main") is None
        assert s.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 2

        s.discovered(kvm=ABSENT)
        assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 2
        await until(lambda: any(r.message.startswith("device lost") for r in caplog.records), "the loss logged")
        assert [r.message for r in caplog.records if r.message.startswith("device lost")] == [
            "device lost while pods hold its units: vm/a, vm/b"
        ]
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_a_prepared_or_unprepared_claim_lists_after_the_debounce(tmp_path: Path) -> None:
    """The kubelet records a prepare's answer once it has it: the List waits a little."""
    s = Setup(tmp_path, dra=DraDevices(DRIVER, lambda: DEVICES))
    server = await serve(s.socket, s.lister)
    try:
        await s.start()
        await until(lambda: s.lister.calls == 1, "the first List")
        s.watch.debounce_s = 0.3
        await asyncio.sleep(0.01)  # past the (zero) gap after the first List
        loop = asyncio.get_running_loop()
        asked = loop.time()
        s.watch.on_claims_changed()
        s.lister.pods = [claimed("vm", "a", "vmm", ("a-kvm", DRIVER, "ate-dev-kvm"))]
        await until(lambda: s.units("vm", "a", "vmm") == 1, "a List after the claim")
        assert loop.time() - asked >= 0.3
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


def rewrite_checkpoint(plugin_dir: Path, n: int = 1) -> None:
    """As the kubelet's device manager does, ``n`` times: a temporary file renamed over it."""
    for i in range(n):
        (plugin_dir / f".tmp{i}").write_text("{}")
        os.rename(plugin_dir / f".tmp{i}", plugin_dir / "kubelet_internal_checkpoint")


async def test_a_checkpoint_rewrite_asks_for_a_list(setup: Setup) -> None:
    setup.watch.gap_s = 0.05
    await setup.start()
    await until(lambda: setup.lister.calls == 1, "the first List")
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
    rewrite_checkpoint(setup.plugin_dir)
    await until(lambda: setup.units("vm", "a", "vmm") == 1, "a List after the rewrite")
    assert setup.lister.calls == 2


class RewrittenWhileAnswering(FakeLister):
    """The kubelet rewrites its checkpoint while it answers the first List."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__()
        self.plugin_dir = plugin_dir

    async def List(self, request: Any, context: Any) -> Any:
        if self.calls == 0:
            rewrite_checkpoint(self.plugin_dir)
        return await super().List(request, context)


async def test_a_rewrite_while_the_kubelet_answers_asks_for_one_more_list(tmp_path: Path) -> None:
    """Armed before the call: a rewrite the answer may not show is not missed."""
    s = Setup(tmp_path)
    s.lister = RewrittenWhileAnswering(s.plugin_dir)
    s.watch.gap_s = 0.05
    server = await serve(s.socket, s.lister)
    try:
        await s.start()
        await until(lambda: s.lister.calls == 2, "one more List for the rewrite during the first")
        await asyncio.sleep(0.2)
        assert s.lister.calls == 2
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_rewrites_wake_once_until_armed_again(tmp_path: Path) -> None:
    wakes = []
    rewrites = Rewrites(str(tmp_path), lambda: wakes.append(1))
    rewrites.start()
    try:
        rewrite_checkpoint(tmp_path, 3)
        await asyncio.sleep(0.05)
        assert wakes == [], "not armed: nothing"
        rewrites.arm()
        rewrite_checkpoint(tmp_path, 20)
        await until(lambda: wakes == [1], "the first rename")
        await asyncio.sleep(0.05)
        assert wakes == [1], "the renames after it woke nothing"
        rewrites.arm()
        rewrites.arm()  # twice: still one watch
        (tmp_path / "other").write_text("written, not renamed")
        await asyncio.sleep(0.05)
        assert wakes == [1]
        rewrite_checkpoint(tmp_path)
        await until(lambda: wakes == [1, 1], "armed again")
    finally:
        rewrites.stop()
        rewrites.stop()


async def test_rewrites_of_a_missing_directory_are_said_once_and_it_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ate_devplugin.podresources.rewrites")
    directory = tmp_path / "device-plugins"
    wakes = []
    rewrites = Rewrites(str(directory), lambda: wakes.append(1))
    rewrites.start()
    try:
        rewrites.arm()
        rewrites.arm()
        said = [r.message for r in caplog.records]
        assert said == ["cannot watch the kubelet's checkpoint: No such file or directory"]
        directory.mkdir()
        rewrites.arm()
        assert caplog.records[-1].message == "watching the kubelet's checkpoint again"
        rewrite_checkpoint(directory)
        await until(lambda: wakes == [1], "the rename")
    finally:
        rewrites.stop()


async def test_the_directory_removed_asks_for_a_list(tmp_path: Path) -> None:
    """Its watch ends with it: the List that follows arms the watch again, on the new one."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    wakes = []
    rewrites = Rewrites(str(directory), lambda: wakes.append(1))
    rewrites.start()
    try:
        rewrites.arm()
        directory.rmdir()
        await until(lambda: wakes == [1], "the watch ended")
    finally:
        rewrites.stop()


POD_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
D = "/var/lib/kubelet/device-plugins"


def fs(kind: str, path: str, dest: str = "", is_dir: bool = False) -> FsEvent:
    return FsEvent(kind=kind, path=path, dest_path=dest, is_directory=is_dir)


POD_ROWS: list[tuple[str, list[FsEvent], bool]] = [
    ("PodResources socket made anew", [fs("created", POD_SOCKET)], True),
    ("PodResources socket renamed into place", [fs("moved", f"{POD_SOCKET}.tmp", POD_SOCKET)], True),
    ("PodResources socket gone: nothing", [fs("deleted", POD_SOCKET)], False),
    (
        "checkpoint rewritten: heard apart, not here",
        [fs("moved", f"{D}/.tmp1", f"{D}/kubelet_internal_checkpoint")],
        False,
    ),
]


@pytest.mark.parametrize(("why", "batch", "asks"), POD_ROWS, ids=[r[0] for r in POD_ROWS])
def test_what_asks_for_a_pod_resources_list(why: str, batch: list[FsEvent], asks: bool) -> None:
    assert asks_for_list(batch, POD_SOCKET) is asks, why


@pytest.mark.parametrize("mode", ["device-plugin", "both", "dra"])
def test_the_daemon_watches_only_the_pod_resources_directory(tmp_path: Path, mode: str) -> None:
    """The checkpoint's rewrites never wake the daemon's watcher (nor its discovery)."""
    pod_dir = tmp_path / "pod-resources"
    pod_dir.mkdir()
    settings = PodResourcesSettings(str(pod_dir / "kubelet.sock"), 60.0, 0.5, 2.0, 5.0, str(tmp_path), mode)
    pods = PodResourcesWatch(settings, PodResourcesMetrics(CollectorRegistry()), NoOpTracer())
    assert pods.watches() == Watches(dirs=frozenset({str(pod_dir)}))
