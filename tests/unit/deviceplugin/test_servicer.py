"""The DevicePlugin service over a real unix socket, driven by a gRPC client (no kubelet)."""

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from ate_devplugin.config import MountConfig, ResourceConfig
from ate_devplugin.deviceplugin.inventory import ResourceState
from ate_devplugin.deviceplugin.server import plugin_server
from ate_devplugin.deviceplugin.servicer import DevicePluginServicer, max_request_bytes, plugin_options
from ate_devplugin.host.devices import DeviceNode, Discovery
from ate_devplugin.observability.metrics import Metrics

RESOURCE = ResourceConfig(
    name="ate.dev/kvm",
    devices=("/dev/kvm",),
    units=8,
    permissions="rw",
    mounts=(MountConfig("/etc/ate", "/var/ate", True),),
    env={"ATE": "1"},
)
PRESENT = Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True)


class Plugin:
    def __init__(self, state: ResourceState, metrics: Metrics, stub: api_pb2_grpc.DevicePluginStub) -> None:
        self.state = state
        self.metrics = metrics
        self.stub = stub

    def count(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"resource_name": RESOURCE.name, **labels})
        assert value is not None, name
        return value


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[Plugin]:
    state = ResourceState(RESOURCE)
    state.update(PRESENT)
    metrics = Metrics(CollectorRegistry())
    metrics.add_resource(RESOURCE.name)
    tracer = NoOpTracerProvider().get_tracer("test")
    server = plugin_server(str(tmp_path / "p.sock"), DevicePluginServicer(state, metrics, tracer))
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{tmp_path}/p.sock") as channel:
        yield Plugin(state, metrics, api_pb2_grpc.DevicePluginStub(channel))  # type: ignore[no-untyped-call]
    state.close()
    await server.stop(0)
    assert not (tmp_path / "p.sock").exists()


def allocate(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


async def test_options_advertise_nothing_by_default(plugin: Plugin) -> None:
    options = await plugin.stub.GetDevicePluginOptions(pb.Empty())
    assert not options.get_preferred_allocation_available
    assert not options.pre_start_required


def test_options_advertise_preferred_allocation_when_configured() -> None:
    preferred = plugin_options(dataclasses.replace(RESOURCE, preferred_allocation=True))
    assert preferred.get_preferred_allocation_available
    assert not preferred.pre_start_required
    assert not plugin_options(RESOURCE).get_preferred_allocation_available


async def test_allocate_returns_device_mounts_env(plugin: Plugin) -> None:
    response = await plugin.stub.Allocate(allocate("kvm-3"))
    (container,) = response.container_responses
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
        ("/dev/kvm", "/dev/kvm", "rw")
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in container.mounts] == [("/etc/ate", "/var/ate", True)]
    assert dict(container.envs) == {"ATE": "1"}
    assert plugin.count("ate_devplugin_allocate_requests_total", code="OK") == 1
    assert plugin.count("ate_devplugin_allocate_duration_seconds_count") == 1


async def test_allocate_answers_each_container_request(plugin: Plugin) -> None:
    request = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["kvm-0"]),
            pb.ContainerAllocateRequest(devices_ids=["kvm-1", "kvm-2"]),
        ]
    )
    response = await plugin.stub.Allocate(request)
    assert len(response.container_responses) == 2


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (allocate("gpu-0"), grpc.StatusCode.INVALID_ARGUMENT, "not of resource"),
        (allocate("kvm-8"), grpc.StatusCode.INVALID_ARGUMENT, "not of resource"),
        (allocate("kvm-1", "kvm-1"), grpc.StatusCode.INVALID_ARGUMENT, "twice"),
        (allocate(), grpc.StatusCode.INVALID_ARGUMENT, "no device IDs"),
        (pb.AllocateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "no container requests"),
        (allocate(*[f"x-{n}" for n in range(5)]), grpc.StatusCode.INVALID_ARGUMENT, "5 device ID(s)"),
        (
            allocate(*[f"x-{n}" for n in range(9)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "9 device IDs, more than the 8 units",
        ),
        (
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["kvm-0"])] * 65),
            grpc.StatusCode.INVALID_ARGUMENT,
            "65 container requests",
        ),
    ],
)
async def test_bad_allocate_gets_status_and_service_goes_on(
    plugin: Plugin, request_: pb.AllocateRequest, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugin.stub.Allocate(request_)
    assert info.value.code() == code
    assert words in (info.value.details() or "")
    assert plugin.count("ate_devplugin_allocate_requests_total", code=code.name) == 1
    assert (await plugin.stub.Allocate(allocate("kvm-0"))).container_responses


async def test_a_request_larger_than_the_kubelet_can_send_is_refused_unread(plugin: Plugin) -> None:
    """The largest request the kubelet can send this resource (one container, every unit
    ID at most twice) passes; one byte more than the bound is refused by gRPC itself."""
    bound = max_request_bytes(RESOURCE)
    every_unit = [f"kvm-{n}" for n in range(RESOURCE.units)]
    largest = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=every_unit, must_include_deviceIDs=every_unit, allocation_size=2**31 - 1
            )
        ]
    )
    assert largest.ByteSize() <= bound
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugin.stub.GetPreferredAllocation(largest)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # decoded and answered
    padding = "k" * (bound - allocate("kvm-0").ByteSize())
    too_large = allocate("kvm-0", padding)
    assert too_large.ByteSize() > bound
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugin.stub.Allocate(too_large)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await plugin.stub.Allocate(allocate("kvm-0"))).container_responses


def test_the_request_bound_follows_units_and_name_length() -> None:
    """About 20 bytes a unit ID (twice in GetPreferredAllocation), never over 4 MiB."""
    default = max_request_bytes(replace(RESOURCE, units=4096))
    assert 70_000 < default < 90_000
    assert max_request_bytes(replace(RESOURCE, units=8192)) > 2 * default - 2048
    assert max_request_bytes(replace(RESOURCE, name="ate.dev/" + "k" * 63, units=50_000)) == 4 * 1024 * 1024


async def test_allocate_while_devices_absent_fails_precondition(plugin: Plugin) -> None:
    plugin.state.update(Discovery(nodes=(), complete=False))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugin.stub.Allocate(allocate("kvm-0"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_preferred_allocation_keeps_must_include_then_lowest(plugin: Plugin) -> None:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["kvm-7", "kvm-2", "kvm-5", "kvm-3"],
                must_include_deviceIDs=["kvm-5"],
                allocation_size=3,
            )
        ]
    )
    response = await plugin.stub.GetPreferredAllocation(request)
    assert list(response.container_responses[0].deviceIDs) == ["kvm-5", "kvm-2", "kvm-3"]
    assert plugin.count("ate_devplugin_preferred_allocation_requests_total") == 1


async def test_preferred_allocation_rejects_impossible_size(plugin: Plugin) -> None:
    request = pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=["kvm-1"], allocation_size=2)]
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugin.stub.GetPreferredAllocation(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_pre_start_container_answers_empty(plugin: Plugin) -> None:
    response = await plugin.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["kvm-0"]))
    assert response == pb.PreStartContainerResponse()


async def test_allocate_follows_the_discovered_nodes(plugin: Plugin) -> None:
    """The container answer is made once, and made again when the nodes change."""

    async def devices() -> list[str]:
        (container,) = (await plugin.stub.Allocate(allocate("kvm-0"))).container_responses
        return [d.host_path for d in container.devices]

    assert await devices() == ["/dev/kvm"]
    plugin.state.update(Discovery(nodes=(DeviceNode("/dev/kvm", 10, 232),), complete=True))  # equal: kept
    assert await devices() == ["/dev/kvm"]
    nodes = (DeviceNode("/dev/kvm", 10, 232), DeviceNode("/dev/kvm1", 10, 233))
    plugin.state.update(Discovery(nodes=nodes, complete=True))
    assert await devices() == ["/dev/kvm", "/dev/kvm1"]


async def test_list_and_watch_sends_full_set_on_connect_and_on_change(plugin: Plugin) -> None:
    stream = plugin.stub.ListAndWatch(pb.Empty())
    first = await stream.read()
    assert [d.ID for d in first.devices] == list(RESOURCE.unit_ids())
    assert {d.health for d in first.devices} == {"Healthy"}
    assert plugin.count("ate_devplugin_list_and_watch_streams") == 1
    plugin.state.update(Discovery(nodes=(), complete=False))
    second = await stream.read()
    assert len(second.devices) == RESOURCE.units
    assert {d.health for d in second.devices} == {"Unhealthy"}
    plugin.state.update(PRESENT)
    assert {d.health for d in (await stream.read()).devices} == {"Healthy"}
    plugin.state.close()
    assert await stream.read() is grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
    assert await stream.code() == grpc.StatusCode.OK
    assert plugin.count("ate_devplugin_list_and_watch_updates_total") == 3


@pytest.mark.parametrize("allocate_with", ["cdi", "both"])
async def test_allocate_names_the_cdi_device_when_the_resource_uses_cdi(tmp_path: Path, allocate_with: str) -> None:
    """'cdi': only the name (the runtime applies the spec: nodes, mounts, env); 'both': the
    device specs too, so a runtime without CDI still gets the nodes."""
    state = ResourceState(replace(RESOURCE, allocate=allocate_with))
    state.update(PRESENT)
    metrics = Metrics(CollectorRegistry())
    server = plugin_server(
        str(tmp_path / "p.sock"), DevicePluginServicer(state, metrics, NoOpTracerProvider().get_tracer("t"))
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{tmp_path}/p.sock") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            response = await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=["kvm-0"]),
                        pb.ContainerAllocateRequest(devices_ids=["kvm-1"]),
                    ]
                )
            )
    finally:
        state.close()
        await server.stop(0)
    assert len(response.container_responses) == 2
    for container in response.container_responses:
        assert [d.name for d in container.cdi_devices] == ["ate.dev/kvm=kvm"]
        if allocate_with == "cdi":
            assert (list(container.devices), list(container.mounts), dict(container.envs)) == ([], [], {})
        else:
            assert [d.host_path for d in container.devices] == ["/dev/kvm"]
            assert [m.container_path for m in container.mounts] == ["/etc/ate"]
            assert dict(container.envs) == {"ATE": "1"}


async def test_allocate_with_device_specs_names_no_cdi_device(plugin: Plugin) -> None:
    (container,) = (await plugin.stub.Allocate(allocate("kvm-0"))).container_responses
    assert list(container.cdi_devices) == []


@pytest.mark.parametrize("allocate_with", ["cdi", "both"])
async def test_allocate_never_names_a_cdi_device_whose_spec_is_not_on_disk(tmp_path: Path, allocate_with: str) -> None:
    """'cdi': FAILED_PRECONDITION saying why (the name is all the answer would hold);
    'both': the device specs only; and the name again once the spec is back."""
    state = ResourceState(replace(RESOURCE, allocate=allocate_with))
    state.update(PRESENT)
    problem = ["/var/run/cdi/ate.dev-kvm.json: Read-only file system"]
    servicer = DevicePluginServicer(
        state, Metrics(CollectorRegistry()), NoOpTracerProvider().get_tracer("t"), lambda _: problem[0]
    )
    server = plugin_server(str(tmp_path / "p.sock"), servicer)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{tmp_path}/p.sock") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            if allocate_with == "cdi":
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Allocate(allocate("kvm-0"))
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "Read-only file system" in (info.value.details() or "")
            else:
                (container,) = (await stub.Allocate(allocate("kvm-0"))).container_responses
                assert list(container.cdi_devices) == []
                assert [d.host_path for d in container.devices] == ["/dev/kvm"]
            problem[0] = ""
            (container,) = (await stub.Allocate(allocate("kvm-0"))).container_responses
            assert [d.name for d in container.cdi_devices] == ["ate.dev/kvm=kvm"]
    finally:
        state.close()
        await server.stop(0)
