"""podresources.py against a fake PodResources server on a unix socket (the real kubelet's
is in tests/e2e/test_pods_holding_units.py). And what filesystem events ask for a List."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from ate_devplugin.api.podresources.v1 import api_pb2 as pb
from ate_devplugin.deviceplugin import podresources
from ate_devplugin.deviceplugin.inventory import HEALTHY, UNHEALTHY
from ate_devplugin.deviceplugin.podresources import PodResourcesWatch, asks_for_list, holdings
from ate_devplugin.host.watcher import FsEvent
from ate_devplugin.observability.metrics import PodResourcesMetrics
from ate_devplugin.settings import PodResourcesSettings
from ate_devplugin.tasks import Guard
from tests.unit.fakes import KVM, TUN, FakeLister, pod, serve, until


class Setup:
    def __init__(self, tmp_path: Path, tracer: Any = None, interval_s: float = 0.0) -> None:
        self.socket = tmp_path / "kubelet.sock"
        self.lister = FakeLister()
        self.registry = CollectorRegistry()
        self.health = {KVM: HEALTHY}
        settings = PodResourcesSettings(str(self.socket), interval_s, debounce_s=0.0, timeout_s=5.0, checkpoint=None)
        self.watch = PodResourcesWatch(
            settings, PodResourcesMetrics(self.registry), tracer or NoOpTracer(), lambda: dict(self.health)
        )
        self.guard = Guard(lambda name, error: None)

    def units(self, namespace: str, name: str, container: str, resource: str = KVM) -> float | None:
        labels = {"resource_name": resource, "namespace": namespace, "pod": name, "container": container}
        return self.registry.get_sample_value("ate_devplugin_pod_units", labels)

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    s = Setup(tmp_path)
    server = await serve(s.socket, s.lister)
    try:
        yield s
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


def test_holdings_counts_units_of_our_resources_per_container() -> None:
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("vm", "worker", ("vmm", KVM, 1), ("sidecar", TUN, 2)),
            pod("vm", "idle", ("main", KVM, 0)),
            pod("gpu", "trainer", ("main", "nvidia.com/gpu", 1)),
        ]
    )
    response.pod_resources[0].containers[0].devices.add(resource_name=KVM, device_ids=["x", "y"])
    assert holdings(response, {KVM}) == {(KVM, "vm", "worker", "vmm"): 3}
    assert holdings(response, {KVM, TUN}) == {(KVM, "vm", "worker", "vmm"): 3, (TUN, "vm", "worker", "sidecar"): 2}


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


async def test_series_are_bounded_and_what_is_dropped_is_counted(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podresources, "MAX_SERIES", 3)
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
        await s.watch.start((), s.guard)
        await until(lambda: s.value("ate_devplugin_pods_holding_units", resource_name=KVM) == 2, "first List")
        calls = s.lister.calls

        s.health[KVM] = UNHEALTHY
        s.watch.health_changed(KVM, UNHEALTHY, None)
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

        s.health[KVM] = HEALTHY
        s.watch.health_changed(KVM, HEALTHY, None)
        assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_the_loss_is_a_child_of_the_device_change(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    s = Setup(tmp_path, tracer=tracer)
    server = await serve(s.socket, s.lister)
    try:
        s.health[KVM] = UNHEALTHY
        with tracer.start_as_current_span("device change") as change:
            cause = context.get_current()
        s.watch.health_changed(KVM, UNHEALTHY, cause)
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
        s.health[KVM] = UNHEALTHY
        s.watch.health_changed(KVM, UNHEALTHY, None)
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


async def test_without_events_the_fallback_interval_lists_again(tmp_path: Path) -> None:
    s = Setup(tmp_path, interval_s=0.05)
    server = await serve(s.socket, s.lister)
    try:
        await s.watch.start((), s.guard)
        await until(lambda: s.lister.calls >= 3, "Lists on the interval")
        s.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
        await until(lambda: s.units("vm", "a", "vmm") == 1, "the pod seen on the interval")
    finally:
        await s.watch.stop(1.0)
        await server.stop(None)


async def test_requests_are_coalesced(setup: Setup) -> None:
    setup.watch.debounce_s = 0.2
    await setup.watch.start((), setup.guard)
    await until(lambda: setup.lister.calls == 1, "the first List")
    for _ in range(20):
        setup.watch.refresh()
    await until(lambda: setup.lister.calls == 2, "one more List for all of them")
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
    setup.watch.refresh()
    await until(lambda: setup.units("vm", "a", "vmm") == 1, "a List for the next request")
    assert setup.lister.calls == 3


async def test_series_of_a_resource_no_longer_served_go(setup: Setup) -> None:
    setup.health[TUN] = HEALTHY
    setup.lister.pods = [pod("vm", "a", ("vmm", TUN, 1))]
    await setup.watch.list_once()
    assert setup.value("ate_devplugin_pods_holding_units", resource_name=TUN) == 1
    del setup.health[TUN]
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
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {"once": True}
    health = setup.watch._health

    def fails_once() -> dict[str, str]:
        if broken.pop("once", False):
            raise RuntimeError("injected")
        return dict(health())

    setup.watch._health = fails_once
    setup.lister.pods = [pod("vm", "a", ("vmm", KVM, 1))]
    await setup.watch.start((), setup.guard)
    await until(lambda: any(r.message == "listing pod resources failed" for r in caplog.records), "logged")
    assert setup.value("ate_devplugin_pod_resources_requests_total", result="error") == 1
    setup.watch.refresh()
    await until(lambda: setup.units("vm", "a", "vmm") == 1, "listed again")


async def test_no_pod_counts_before_a_list_answered(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.health[KVM] = UNHEALTHY
    s.watch.health_changed(KVM, UNHEALTHY, None)
    await s.watch.list_once()  # no socket
    assert s.value("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) is None
    assert s.value("ate_devplugin_pods_holding_units", resource_name=KVM) is None
    await s.watch.stop(1.0)


D = "/var/lib/kubelet/device-plugins"


def fs(kind: str, path: str, dest: str = "", is_dir: bool = False) -> FsEvent:
    return FsEvent(kind=kind, path=path, dest_path=dest, is_directory=is_dir)


CHECKPOINT = f"{D}/kubelet_internal_checkpoint"


POD_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


POD_ROWS: list[tuple[str, list[FsEvent], bool]] = [
    (
        "checkpoint rewritten (temp file renamed over it)",
        [
            fs("created", f"{D}/.tmp1"),
            fs("closed", f"{D}/.tmp1"),
            fs("moved", f"{D}/.tmp1", f"{D}/kubelet_internal_checkpoint"),
        ],
        True,
    ),
    ("checkpoint written in place", [fs("closed", f"{D}/kubelet_internal_checkpoint")], True),
    ("checkpoint removed: nothing", [fs("deleted", f"{D}/kubelet_internal_checkpoint")], False),
    ("PodResources socket made anew", [fs("created", POD_SOCKET)], True),
    ("PodResources socket gone: nothing", [fs("deleted", POD_SOCKET)], False),
]


@pytest.mark.parametrize(("why", "batch", "asks"), POD_ROWS, ids=[r[0] for r in POD_ROWS])
def test_what_asks_for_a_pod_resources_list(why: str, batch: list[FsEvent], asks: bool) -> None:
    assert asks_for_list(batch, CHECKPOINT, POD_SOCKET) is asks, why


def test_pods_not_read_by_the_device_plugin_no_checkpoint_events() -> None:
    assert not asks_for_list([fs("moved", f"{D}/.tmp", CHECKPOINT)], None, POD_SOCKET)


def _reference(response: pb.ListPodResourcesResponse, resources: set[str]) -> dict[podresources.Key, int]:
    """What the answer says, read from protobuf's own parse of it."""
    held: dict[podresources.Key, int] = {}
    for p in pb.ListPodResourcesResponse.FromString(response.SerializeToString()).pod_resources:
        for c in p.containers:
            for d in c.devices:
                if d.resource_name in resources and d.device_ids:
                    key = (d.resource_name, p.namespace, p.name, c.name)
                    held[key] = held.get(key, 0) + len(d.device_ids)
    return held


names = st.text(st.characters(codec="utf-8"), max_size=8)


@st.composite
def answers(draw: st.DrawFn) -> pb.ListPodResourcesResponse:
    response = pb.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, 4))):
        p = response.pod_resources.add(name=draw(names), namespace=draw(names))
        for _ in range(draw(st.integers(0, 3))):
            c = p.containers.add(name=draw(names), cpu_ids=draw(st.lists(st.integers(-(2**63), 2**63 - 1))))
            c.memory.add(memory_type="memory", size=draw(st.integers(0, 2**64 - 1)))
            for _ in range(draw(st.integers(0, 3))):
                d = c.devices.add(resource_name=draw(st.sampled_from([KVM, TUN, "nvidia.com/gpu", ""])))
                d.device_ids.extend(draw(st.lists(names, max_size=3)))
                d.topology.nodes.add(ID=draw(st.integers(0, 2**63 - 1)))
    return response


@given(answers())
@settings(max_examples=300, deadline=None)
def test_the_wire_walk_reads_what_protobuf_reads(response: pb.ListPodResourcesResponse) -> None:
    assert holdings(response.SerializeToString(), {KVM, TUN}) == _reference(response, {KVM, TUN})


def test_an_answer_cut_short_or_not_utf8_is_undecodable() -> None:
    data = pb.ListPodResourcesResponse(pod_resources=[pod("vm", "a", ("vmm", KVM, 2))]).SerializeToString()
    for cut in range(1, len(data)):
        with pytest.raises(podresources.DecodeError):
            podresources.read_holdings(data[:cut], {KVM})
    not_utf8 = data.replace(b"vmm", b"\xff\xfe\xfd")
    with pytest.raises(podresources.DecodeError):
        podresources.read_holdings(not_utf8, {KVM})


def test_names_are_cut_to_the_kubernetes_limits_and_entries_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    long_pod = pod("n" * 100, "p" * 300, ("c" * 100, KVM, 1))
    found = podresources.read_holdings(pb.ListPodResourcesResponse(pod_resources=[long_pod]).SerializeToString(), {KVM})
    assert found.held == {(KVM, "n" * 63, "p" * 253, "c" * 63): 1}
    assert found.truncated == 1
    monkeypatch.setattr(podresources, "MAX_HELD", 2)
    many = pb.ListPodResourcesResponse(pod_resources=[pod("vm", f"p{i}", ("vmm", KVM, 1)) for i in range(5)])
    found = podresources.read_holdings(many.SerializeToString(), {KVM})
    assert (len(found.held), found.dropped) == (2, 3)
