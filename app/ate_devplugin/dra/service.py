"""The DRA node service the kubelet calls: NodePrepareResources / NodeUnprepareResources.

Both versions the kubelet 1.35 speaks (v1, v1beta1) are served by one implementation.
A claim is prepared by reading it from the API server and answering, for each device the
scheduler allocated from this node's pool, the CDI device of the device's resource (once
per request: N devices of one request are N times the same device node) and, for a share
of a shareable device, its share ID (v1 only: v1beta1 has no field for it).
Nothing on the node changes per claim (the CDI spec is per resource and always there), so
both calls are idempotent and survive restarts of either side: a prepare repeated after a
kubelet restart answers the same, and an unprepare of a claim never seen here is a success.

What a call can cost is bounded whatever it holds: the kubelet sends one call per pod with
that pod's claims of this driver (a pod that needs /dev/kvm has one, rarely a few), so at
most ``MAX_CLAIMS_PER_CALL`` claims of a call are read (the API client reads a few at
once) and every claim past them fails alone, saying so; the reads share one budget,
``PREPARE_BUDGET_S``, under the kubelet's 45 s timeout, so the call answers in time with
a reason for every claim still unread. Every failure has a non-empty reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import grpc
from opentelemetry.trace import Span, SpanKind, Tracer

from ate_devplugin.api.dra.v1 import api_pb2 as v1
from ate_devplugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from ate_devplugin.api.dra.v1beta1 import api_pb2 as v1beta1
from ate_devplugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from ate_devplugin.dra.names import InvalidNameError, check_name, check_namespace
from ate_devplugin.observability.logs import reason
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.observability.tracing import rpc_span, set_rpc_status

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# A pod that asks for /dev/kvm sends one claim, rarely a few: 128 is far past any real
# pod, and few enough that reading them all (a few at once) fits the budget below.
MAX_CLAIMS_PER_CALL = 128
PREPARE_BUDGET_S = 30.0  # the kubelet gives a call 45 s


class ClaimNotFoundError(Exception):
    pass


class ClaimReader(Protocol):
    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim as JSON; raises ClaimNotFoundError when it does not exist."""
        ...


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedDevice:
    request: str  # the base request name (a subrequest "req/sub" counts for "req")
    device: str
    cdi_ids: tuple[str, ...]  # empty when an earlier device of the request names the same CDI device
    share_id: str = ""  # the allocation's shareID, for a share of a shareable device


@dataclass
class ClaimResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class DraDriver:
    """The version-free logic; ``lookup`` maps a published device name to its CDI device ID,
    ``cdi_problem`` says why that device's CDI spec is not on disk ("" when it is),
    ``changed`` hears of every prepare and unprepare answered."""

    def __init__(
        self,
        driver: str,
        pool: str,
        lookup: Callable[[str], str | None],
        claims: ClaimReader,
        metrics: DraMetrics,
        cdi_problem: Callable[[str], str] = lambda _: "",
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.driver = driver
        self.changed = changed
        self.pool = pool
        self.lookup = lookup
        self.cdi_problem = cdi_problem
        self.claims = claims
        self.metrics = metrics
        self.prepared: set[str] = set()  # claim UIDs; informational (nothing to undo per claim)

    async def prepare(self, refs: list[ClaimRef]) -> dict[str, ClaimResult]:
        results = await self._prepare_within_bounds(refs)
        for ref, result in zip(refs, results, strict=True):
            self.metrics.claims.labels("NodePrepareResources", "error" if result.error else "success").inc()
            if not result.error:
                self.prepared.add(ref.uid)
        self.metrics.claims_prepared.set(len(self.prepared))
        self.changed()
        return {ref.uid: result for ref, result in zip(refs, results, strict=True)}

    async def _prepare_within_bounds(self, refs: list[ClaimRef]) -> list[ClaimResult]:
        """One result per claim: the first MAX_CLAIMS_PER_CALL read within the budget, the rest refused."""
        read, past = refs[:MAX_CLAIMS_PER_CALL], refs[MAX_CLAIMS_PER_CALL:]
        tasks = [asyncio.ensure_future(self._prepare_one(ref)) for ref in read]
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=PREPARE_BUDGET_S)
        finally:  # also when the kubelet gave up on the call: no read outlives it
            for task in tasks:
                task.cancel()
        results = []
        for ref, task in zip(read, tasks, strict=True):
            if task.done() and not task.cancelled():
                results.append(task.result())
            else:
                results.append(ClaimResult(error=f"{_where(ref)} not read within {PREPARE_BUDGET_S:g}s"))
        refused = ClaimResult(error=f"more than {MAX_CLAIMS_PER_CALL} claims in one call; this one is not read")
        return results + [refused] * len(past)

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, ClaimResult]:
        for ref in refs:
            self.prepared.discard(ref.uid)
            self.metrics.claims.labels("NodeUnprepareResources", "success").inc()
        self.metrics.claims_prepared.set(len(self.prepared))
        self.changed()
        return {ref.uid: ClaimResult() for ref in refs}

    async def _prepare_one(self, ref: ClaimRef) -> ClaimResult:
        where = _where(ref)
        try:
            check_namespace(ref.namespace)
            check_name(ref.name, "claim name")
        except InvalidNameError as exc:
            return ClaimResult(error=f"{where}: {exc}")
        try:
            claim = await self.claims.get_claim(ref.namespace, ref.name)
        except ClaimNotFoundError:
            return ClaimResult(error=f"{where} not found")
        except Exception as exc:  # the API server's answer is per claim: one failure fails one claim
            log.warning("cannot read %s: %s", where, reason(exc))
            return ClaimResult(error=f"cannot read {where}: {reason(exc)}")
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            return ClaimResult(error=f"{where} was replaced: UID {uid}, expected {ref.uid}")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            return ClaimResult(error=f"{where} is not allocated")
        devices = []
        injected: set[tuple[str, str]] = set()  # (request, CDI ID) already answered
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != self.driver:
                continue
            if result.get("pool") != self.pool:
                return ClaimResult(
                    error=f"{where}: device {result.get('device')} is from pool {result.get('pool')}, "
                    f"not this node's pool {self.pool}"
                )
            cdi_id = self.lookup(result.get("device", ""))
            if cdi_id is None:
                return ClaimResult(error=f"{where}: device {result.get('device')} is not published by this node")
            if problem := self.cdi_problem(result.get("device", "")):
                # The runtime could not resolve the name: the kubelet retries the claim later.
                device = result.get("device")
                return ClaimResult(error=f"{where}: the CDI spec of device {device} is not in place: {problem}")
            request = str(result.get("request", "")).split("/", 1)[0]
            first = (request, cdi_id) not in injected
            injected.add((request, cdi_id))
            devices.append(
                PreparedDevice(
                    request=request,
                    device=result["device"],
                    cdi_ids=(cdi_id,) if first else (),
                    share_id=str(result.get("shareID") or ""),
                )
            )
        log.info(
            "claim prepared",
            extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid, "devices": [d.device for d in devices]},
        )
        return ClaimResult(devices=devices)


class DraServicer:
    """One DRAPlugin service version, as the kubelet calls it."""

    def __init__(self, driver: DraDriver, pb: ModuleType, tracer: Tracer) -> None:
        self.driver = driver
        self.pb = pb
        self.tracer = tracer
        self.service = f"{pb.DESCRIPTOR.package}.DRAPlugin"
        self.has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        with self._call("NodePrepareResources") as span:
            span.set_attribute("ate_devplugin.claims", len(request.claims))
            results = await self.driver.prepare([_ref(c) for c in request.claims])
            response = self.pb.NodePrepareResourcesResponse()
            for uid, result in results.items():
                answer = response.claims[uid]
                if result.error:
                    answer.error = result.error
                for d in result.devices:
                    device = answer.devices.add(
                        request_names=[d.request] if d.request else [],
                        pool_name=self.driver.pool,
                        device_name=d.device,
                        cdi_device_ids=d.cdi_ids,
                    )
                    if d.share_id and self.has_share_id:
                        device.share_id = d.share_id
            return response

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        with self._call("NodeUnprepareResources") as span:
            span.set_attribute("ate_devplugin.claims", len(request.claims))
            results = self.driver.unprepare([_ref(c) for c in request.claims])
            response = self.pb.NodeUnprepareResourcesResponse()
            for uid in results:
                response.claims[uid].SetInParent()
            return response

    @contextmanager
    def _call(self, method: str) -> Iterator[Span]:
        """The span and the latency of one call."""
        start = time.perf_counter()
        try:
            with rpc_span(self.tracer, self.service, method, SpanKind.SERVER) as span:
                yield span
                set_rpc_status(span, grpc.StatusCode.OK.value[0], "OK")
        finally:
            self.driver.metrics.call_duration.labels(method).observe(time.perf_counter() - start)


def _where(ref: ClaimRef) -> str:
    return f"claim {ref.namespace[:80]}/{ref.name[:260]}"  # a name past the API's limits is cut


def _ref(claim: Any) -> ClaimRef:
    return ClaimRef(namespace=claim.namespace, uid=claim.uid, name=claim.name)


def add_to_server(driver: DraDriver, tracer: Tracer, server: grpc.aio.Server) -> None:
    """Serves v1 and v1beta1 on one server."""
    v1_grpc.add_DRAPluginServicer_to_server(DraServicer(driver, v1, tracer), server)  # type: ignore[no-untyped-call]
    v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DraServicer(driver, v1beta1, tracer), server
    )
