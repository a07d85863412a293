"""Device health as the kubelet watches it: the full list at once, again on every change
and within the timeout, over the plugin's real socket in both versions."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.api.drahealth.v1 import api_pb2 as v1
from ate_devplugin.api.drahealth.v1 import api_pb2_grpc as v1_grpc
from ate_devplugin.api.drahealth.v1alpha1 import api_pb2 as v1alpha1
from ate_devplugin.api.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from ate_devplugin.dra.health import MESSAGE_MAX, DeviceReport, HealthBoard, HealthServicer, message
from ate_devplugin.host.sockets import UnixServer
from ate_devplugin.observability.metrics import DraMetrics
from tests.unit.dra.test_plugin import ABSENT, NODE, PRESENT, SHARED, SLOTS, Rig
from tests.unit.fakes import until


def health(response: Any) -> list[tuple[str, str, str, int, str]]:
    return [
        (d.device.pool_name, d.device.device_name, v1.HealthStatus.Name(d.health), d.health_check_timeout_seconds,
         d.message)
        for d in response.devices
    ]  # fmt: skip


@pytest.mark.parametrize(("pb", "grpc_mod"), [(v1, v1_grpc), (v1alpha1, v1alpha1_grpc)])
async def test_the_kubelet_sees_every_device_and_each_change_at_once(tmp_path: Path, pb: Any, grpc_mod: Any) -> None:
    rig = Rig(tmp_path)
    await rig.start()
    try:
        rig.discover(PRESENT)
        version = pb.DESCRIPTOR.package
        async with rig.channel(rig.settings.socket) as channel:
            stream = grpc_mod.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
            first = await stream.read()
            before = time.time()
            ok = "ate.dev/kvm: every device node present"
            assert health(first) == [(NODE, name, "HEALTHY", 30, ok) for name in [SHARED, *SLOTS]]
            assert abs(first.devices[0].last_updated_time - before) <= 2
            assert rig.sample("ate_devplugin_dra_health_streams", version=version) == 1
            rig.discover(ABSENT)
            # Long before the 10 s resend: the change itself is sent.
            gone = await asyncio.wait_for(stream.read(), 5)
            missing = "ate.dev/kvm: device node missing (/dev/kvm)"
            assert health(gone) == [(NODE, name, "UNHEALTHY", 30, missing) for name in [SHARED, *SLOTS]]
            rig.discover(PRESENT)
            back = await asyncio.wait_for(stream.read(), 5)
            assert {h[2] for h in health(back)} == {"HEALTHY"}
            stream.cancel()
        await until(lambda: rig.sample("ate_devplugin_dra_health_streams", version=version) == 0, "stream closed")
    finally:
        await rig.plugin.stop(2.0)


async def test_the_same_list_goes_again_with_a_fresh_time_before_the_timeout(tmp_path: Path) -> None:
    board = HealthBoard()
    board.update([DeviceReport("ate-dev-kvm", True, "ok")])
    clock = itertools.count(1000, 7)
    servicer = HealthServicer(
        board, NODE, v1, DraMetrics(CollectorRegistry()), resend_s=0.05, clock=lambda: next(clock)
    )
    path = str(tmp_path / "health.sock")
    add = v1_grpc.add_DRAResourceHealthServicer_to_server
    server = UnixServer(path, lambda s: add(servicer, s))  # type: ignore[no-untyped-call]
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = v1_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.NodeWatchResources(v1.NodeWatchResourcesRequest())
            times = []
            for _ in range(3):
                response = await asyncio.wait_for(stream.read(), 5)
                assert health(response) == [(NODE, "ate-dev-kvm", "HEALTHY", 30, "ok")]
                times.append(response.devices[0].last_updated_time)
            assert times == [1000, 1007, 1014]
            stream.cancel()
    finally:
        await server.stop(0.2)


def test_a_long_message_is_cut_to_what_the_kubelet_keeps() -> None:
    assert message("x" * MESSAGE_MAX) == "x" * MESSAGE_MAX
    cut = message("y" * 5000)
    assert (len(cut), cut[-6:]) == (MESSAGE_MAX, "yyy...")
