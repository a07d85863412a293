import asyncio
import random
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, StatusCode

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from ate_devplugin.deviceplugin.registration import RegistrationError, register
from ate_devplugin.tasks import Backoff


def test_backoff_grows_jittered_and_caps() -> None:
    backoff = Backoff(initial=0.02, cap=1.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(10)]
    nominal = [min(1.0, 0.02 * 2**n) for n in range(10)]
    for delay, d in zip(delays, nominal, strict=True):
        assert d / 2 <= delay <= d
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    backoff.reset()
    assert backoff.next() <= 0.02


class Kubelet(api_pb2_grpc.RegistrationServicer):
    """A Registration service answering as told, on a unix socket of the test's."""

    def __init__(self, abort_with: grpc.StatusCode | None = None, hang: bool = False) -> None:
        self.abort_with = abort_with
        self.hang = hang
        self.requests: list[pb.RegisterRequest] = []

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Empty:
        self.requests.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.abort_with is not None:
            await context.abort(self.abort_with, "told to refuse")
        return pb.Empty()


async def serving(kubelet: Kubelet, path: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)  # type: ignore[no-untyped-call]  # generated code is unannotated
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


TRACER = NoOpTracerProvider().get_tracer("test")
OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)


async def test_register_sends_what_the_kubelet_needs(tmp_path: Path) -> None:
    kubelet = Kubelet()
    server = await serving(kubelet, tmp_path / "kubelet.sock")
    try:
        await register(str(tmp_path / "kubelet.sock"), "ate-kvm.sock", "ate.dev/kvm", OPTIONS, TRACER, timeout=5)
    finally:
        await server.stop(None)
    (request,) = kubelet.requests
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", "ate-kvm.sock", "ate.dev/kvm")
    assert request.options == OPTIONS


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (grpc.StatusCode.UNKNOWN, "rejected"),
        (grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
        (grpc.StatusCode.UNAVAILABLE, "unavailable"),
        (grpc.StatusCode.INTERNAL, "error"),
    ],
)
async def test_a_refusal_is_a_registration_error_with_its_reason(
    tmp_path: Path, code: grpc.StatusCode, reason: str
) -> None:
    server = await serving(Kubelet(abort_with=code), tmp_path / "kubelet.sock")
    try:
        with pytest.raises(RegistrationError) as caught:
            await register(str(tmp_path / "kubelet.sock"), "ate-kvm.sock", "ate.dev/kvm", OPTIONS, TRACER, timeout=5)
    finally:
        await server.stop(None)
    assert caught.value.reason == reason
    assert "ate.dev/kvm" in str(caught.value)


async def test_a_hanging_kubelet_times_out(tmp_path: Path) -> None:
    server = await serving(Kubelet(hang=True), tmp_path / "kubelet.sock")
    try:
        with pytest.raises(RegistrationError) as caught:
            await register(str(tmp_path / "kubelet.sock"), "ate-kvm.sock", "ate.dev/kvm", OPTIONS, TRACER, timeout=0.2)
    finally:
        await server.stop(0)
    assert caught.value.reason == "timeout"


async def test_no_kubelet_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RegistrationError) as caught:
        await register(str(tmp_path / "absent.sock"), "ate-kvm.sock", "ate.dev/kvm", OPTIONS, TRACER, timeout=5)
    assert caught.value.reason == "unavailable"


async def test_an_abandoned_attempt_says_so_in_its_span(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    kubelet = Kubelet(hang=True)
    server = await serving(kubelet, tmp_path / "kubelet.sock")
    tracer = provider.get_tracer("test")
    try:
        attempt = asyncio.ensure_future(
            register(str(tmp_path / "kubelet.sock"), "ate-kvm.sock", "ate.dev/kvm", OPTIONS, tracer, timeout=5)
        )
        while not kubelet.requests:
            await asyncio.sleep(0.01)
        attempt.cancel()  # as the agent does when a new kubelet comes
        with pytest.raises(asyncio.CancelledError):
            await attempt
    finally:
        await server.stop(0)
    (span,) = exporter.get_finished_spans()
    assert span.name == "v1beta1.Registration/Register"
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert span.status.status_code == StatusCode.ERROR
