"""The DevicePlugin gRPC service of one resource: protocol translation only."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
from opentelemetry.trace import NoOpTracer, SpanKind, Tracer

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.config import ALLOCATE_CDI, MAX_MESSAGE_BYTES, ResourceConfig
from ate_devplugin.deviceplugin.inventory import HEALTHY, ResourceState
from ate_devplugin.host.cdi import device_id
from ate_devplugin.host.devices import DeviceNode
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.observability.tracing import rpc_span, set_rpc_status, trace_id_exemplar

log = logging.getLogger(__name__)

SERVICE = "v1beta1.DevicePlugin"
# GetPreferredAllocation is advertised only where the configuration asks for it: units
# are interchangeable, and without it the kubelet makes one call per admission, not two.
_OPTIONS = {
    preferred: pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=preferred)
    for preferred in (False, True)
}
# The kubelet sends one container request per call; a bound keeps a hostile caller from
# holding the event loop (and everyone else) with thousands of them.
MAX_CONTAINER_REQUESTS = 64


def max_request_bytes(config: ResourceConfig) -> int:
    """The largest request the kubelet can send this resource, encoded.

    The kubelet asks for one container at a time, and a container gets at most every unit:
    an Allocate or PreStartContainer names each unit ID at most once, a
    GetPreferredAllocation at most twice (available and must-include) plus a size. The
    container wrappers of MAX_CONTAINER_REQUESTS are allowed on top. A larger request is
    refused by gRPC before it is read whole (a 4 MiB Allocate of unit IDs costs over
    100 MiB to hold); for the default 4096 units this is about 80 KB, and never more than
    the 4 MiB gRPC allows by default.
    """
    ids = sum(_field_bytes(len(unit)) for unit in config.unit_ids())
    per_container = _field_bytes(2 * ids + 1 + 10)  # ids twice, allocation_size (tag, int32)
    bound = per_container + MAX_CONTAINER_REQUESTS * _field_bytes(0) + 1024  # + room for unknown fields
    return min(bound, MAX_MESSAGE_BYTES)


def _field_bytes(length: int) -> int:
    """A length-delimited field's encoded size: tag, length, bytes."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


# The servicer's methods see the context only to abort with a status.
Context = grpc.aio.ServicerContext[Any, Any]
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def plugin_options(config: ResourceConfig) -> pb.DevicePluginOptions:
    """The options of a resource, as registered and as GetDevicePluginOptions answers."""
    return _OPTIONS[config.preferred_allocation]


class RequestError(Exception):
    """A request the daemon refuses; becomes the given gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class DevicePluginServicer:
    """The answers of one resource's DevicePlugin service (registered by server.py)."""

    def __init__(
        self, state: ResourceState, metrics: Metrics, tracer: Tracer, cdi_problem: Callable[[str], str] = lambda _: ""
    ) -> None:
        """``cdi_problem(resource)`` says why the resource's CDI spec is not on disk ("" when
        it is): no answer names a CDI device the runtime cannot resolve."""
        self.state = state
        self.cdi_problem = cdi_problem
        self.metrics = metrics
        self.tracer = tracer
        # The API's no-op tracer (tracing off) records nothing: skip span work altogether.
        self._traced = not isinstance(tracer, NoOpTracer)
        self.resource = state.config.name
        self._options_message = plugin_options(state.config)
        self._encoded: dict[str, bytes] = {}
        # The answer for one container request (what the kubelet sends), remade only when
        # the discovered nodes change (every filesystem event brings a new, usually equal,
        # discovery). Messages are never changed after they are made, so one serves all calls.
        self._answer_of_one: dict[bool, tuple[tuple[DeviceNode, ...], pb.AllocateResponse]] = {}  # by "with CDI"
        # Series children looked up once: labels() costs a lock and a dict per call.
        self._preferred_calls = metrics.preferred_allocation_requests.labels(self.resource)
        self._allocate_calls: dict[grpc.StatusCode, Any] = {}
        self._allocate_seconds = metrics.allocate_duration.labels(self.resource)

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions:
        return await self._unary("GetDevicePluginOptions", request, context, self._options)

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        return await self._unary("Allocate", request, context, self._allocate, self._record_allocate)

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> pb.PreferredAllocationResponse:
        self._preferred_calls.inc()
        return await self._unary("GetPreferredAllocation", request, context, self._preferred)

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> pb.PreStartContainerResponse:
        return await self._unary("PreStartContainer", request, context, lambda _: pb.PreStartContainerResponse())

    async def ListAndWatch(self, request: pb.Empty, context: Context) -> AsyncIterator[bytes]:
        """Encoded ListAndWatchResponse messages: the full list now and after every change."""
        state = self.state
        token = state.stream_opened()
        self.metrics.list_and_watch_streams.labels(self.resource).inc()
        log.info("kubelet opened ListAndWatch", extra={"resource": self.resource})
        try:
            while not state.closed:
                seen = state.version
                response = self._device_list(state.health)
                # Not made current: the context would stay attached across the yield.
                span = self.tracer.start_span(
                    f"{SERVICE}/ListAndWatch update",
                    context=state.change_context,
                    kind=SpanKind.SERVER,
                    attributes={
                        "rpc.system": "grpc",
                        "rpc.service": SERVICE,
                        "rpc.method": "ListAndWatch",
                        "ate_devplugin.resource_name": self.resource,
                        "ate_devplugin.units": state.config.units,
                        "ate_devplugin.health": state.health,
                    },
                )
                try:
                    yield response
                finally:
                    span.end()
                self.metrics.list_and_watch_updates.labels(self.resource).inc()
                await state.wait_for_change(seen)
        finally:
            state.stream_closed(token)
            self.metrics.list_and_watch_streams.labels(self.resource).dec()
            log.info("ListAndWatch ended", extra={"resource": self.resource})

    # --- the answers -------------------------------------------------------------

    def _options(self, _: pb.Empty) -> pb.DevicePluginOptions:
        return self._options_message

    def _device_list(self, health: str) -> bytes:
        """The full unit list in one health, encoded once and shared by every stream."""
        encoded = self._encoded.get(health)
        if encoded is None:
            units = self.state.config.unit_ids()
            encoded = pb.ListAndWatchResponse(
                devices=[pb.Device(ID=i, health=health) for i in units]
            ).SerializeToString()
            self._encoded[health] = encoded
        return encoded

    def _check_ids(self, ids: Sequence[str], what: str) -> set[str]:
        """The IDs as a set, once every one is a unit of this resource, listed once.

        Set operations in C only: the kubelet offers every free unit (thousands) in each
        GetPreferredAllocation.
        """
        if len(ids) > self.state.config.units:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: {len(ids)} device IDs, more than the {self.state.config.units} units of {self.resource}",
            )
        unique = set(ids)
        if unique <= self.state.known_ids:
            if len(unique) != len(ids):
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: a device ID is listed twice")
            return unique
        unknown = unique.difference(self.state.known_ids)
        if unknown:
            shown = ", ".join(_short(i) for i in sorted(unknown)[:3]) + (" ..." if len(unknown) > 3 else "")
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: {len(unknown)} device ID(s) not of resource {self.resource}: {shown}",
            )
        if len(unique) != len(ids):
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: a device ID is listed twice")
        return unique

    def _container_requests(self, requests: Sequence[Req]) -> Sequence[Req]:
        if not requests:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "no container requests")
        if len(requests) > MAX_CONTAINER_REQUESTS:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(requests)} container requests, more than {MAX_CONTAINER_REQUESTS} in one call",
            )
        return requests

    def _allocate(self, request: pb.AllocateRequest) -> pb.AllocateResponse:
        requests = self._container_requests(request.container_requests)
        state = self.state
        for n, creq in enumerate(requests):
            if not creq.devices_ids:
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"container request {n}: no device IDs")
            self._check_ids(creq.devices_ids, f"container request {n}")
        if state.health != HEALTHY:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.resource}: device nodes are absent ({', '.join(state.config.devices)})",
            )
        with_cdi = state.config.uses_cdi
        if with_cdi and (problem := self.cdi_problem(self.resource)):
            if state.config.allocate == ALLOCATE_CDI:  # the name is all the answer would have
                raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {problem}")
            log.warning("Allocate answers with device specs only: %s", problem, extra={"resource": self.resource})
            with_cdi = False
        # Every unit of a resource stands for the same device nodes: each container gets them once.
        one = self._allocate_one(with_cdi)
        if len(requests) == 1:
            return one
        return pb.AllocateResponse(container_responses=list(one.container_responses) * len(requests))

    def _allocate_one(self, with_cdi: bool) -> pb.AllocateResponse:
        nodes = self.state.discovery.nodes
        made = self._answer_of_one.get(with_cdi)
        if made is None or made[0] != nodes:
            config = self.state.config
            container = pb.ContainerAllocateResponse()
            if config.allocate != ALLOCATE_CDI:  # device specs: any runtime applies them
                container.envs.update(config.env)
                container.mounts.extend(
                    pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                    for m in config.mounts
                )
                container.devices.extend(
                    pb.DeviceSpec(container_path=n.host_path, host_path=n.host_path, permissions=config.permissions)
                    for n in nodes
                )
            if with_cdi:  # the runtime applies the resource's CDI spec (nodes, mounts, env)
                container.cdi_devices.append(pb.CDIDevice(name=device_id(config.name)))
            made = self._answer_of_one[with_cdi] = (nodes, pb.AllocateResponse(container_responses=[container]))
        return made[1]

    def _preferred(self, request: pb.PreferredAllocationRequest) -> pb.PreferredAllocationResponse:
        responses = []
        for n, creq in enumerate(self._container_requests(request.container_requests)):
            available = self._check_ids(creq.available_deviceIDs, f"container request {n} available")
            must = list(creq.must_include_deviceIDs)
            self._check_ids(must, f"container request {n} must_include")
            size = creq.allocation_size
            if size < 0 or size > len(available):
                raise RequestError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"container request {n}: allocation_size {size} outside 0..{len(available)}",
                )
            # Asked for in the configuration: prefer the lowest-numbered, so allocations
            # read predictably in the kubelet's checkpoint. The scan walks the units in
            # use (the lowest ones, mostly) and stops at the first free ones it needs.
            chosen = must[:size]
            if len(chosen) < size:
                if must:
                    available.difference_update(must)
                free = filter(available.__contains__, self.state.config.unit_ids())
                chosen += itertools.islice(free, size - len(chosen))
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def _record_allocate(self, code: grpc.StatusCode, seconds: float, exemplar: dict[str, str] | None) -> None:
        calls = self._allocate_calls.get(code)
        if calls is None:
            calls = self._allocate_calls[code] = self.metrics.allocate_requests.labels(self.resource, code.name)
        calls.inc()
        self._allocate_seconds.observe(seconds, exemplar=exemplar)

    # --- one wrapper for status, span, metrics and logs of unary calls ----------

    async def _unary(
        self,
        method: str,
        request: Req,
        context: Context,
        handler: Callable[[Req], Resp],
        record: Callable[[grpc.StatusCode, float, dict[str, str] | None], None] | None = None,
    ) -> Resp:
        start = time.perf_counter()
        if not self._traced:  # the admission path: no span to make, attribute or end
            response, code, message = self._answer(method, request, handler)
            if record is not None:
                record(code, time.perf_counter() - start, None)
        else:
            with rpc_span(self.tracer, SERVICE, method, SpanKind.SERVER) as span:
                span.set_attribute("ate_devplugin.resource_name", self.resource)
                response, code, message = self._answer(method, request, handler)
                set_rpc_status(span, code.value[0], code.name, message)
                if record is not None:
                    record(code, time.perf_counter() - start, trace_id_exemplar(span))
        if response is None:
            await context.abort(code, message)
        return response

    def _answer(
        self, method: str, request: Req, handler: Callable[[Req], Resp]
    ) -> tuple[Resp | None, grpc.StatusCode, str]:
        try:
            return handler(request), grpc.StatusCode.OK, ""
        except RequestError as exc:
            log.warning("%s refused: %s", method, exc, extra={"resource": self.resource})
            return None, exc.code, str(exc)
        except Exception as exc:
            log.exception("%s failed", method, extra={"resource": self.resource})
            return None, grpc.StatusCode.INTERNAL, f"{method}: internal error: {exc}"


def _short(device_id: str, limit: int = 64) -> str:
    """An ID as an error may quote it: the client's input, bounded."""
    return repr(device_id if len(device_id) <= limit else device_id[:limit] + "...")
