"""Which pods hold units of the daemon's resources, from the kubelet's PodResources API.

The API (v1: List, GetAllocatableResources, Get) has no watch, so the daemon lists again
when something may have changed: the kubelet's device manager rewrote its checkpoint (it
does after every allocation to a container and after every device list a plugin sends),
one of our resources changed health, or the PodResources socket was made anew. Freeing a
deleted pod's units writes no checkpoint: the fallback interval bounds how long its series
outlives it. Requests are coalesced: the first lists at once, those that come meanwhile
make one more List after ``debounce_s``.

An answer is read as untrusted input, off the event loop and in bounded memory: at most
MAX_ANSWER_BYTES are received, and the wire format is walked in a worker thread for the few
fields that matter, without building the message (a 4 MiB answer of empty entries would
take over 100 MiB as protobuf objects). Label values are cut to the Kubernetes name limits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from ate_devplugin.api.podresources.v1 import api_pb2 as pb
from ate_devplugin.config import ResourceConfig
from ate_devplugin.deviceplugin.inventory import UNHEALTHY
from ate_devplugin.host.devices import Discovery
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.metrics import PodResourcesMetrics
from ate_devplugin.observability.tracing import rpc_span, set_rpc_status
from ate_devplugin.settings import PodResourcesSettings
from ate_devplugin.tasks import Guard, Worker, WorkerBusyError, cancel

log = logging.getLogger(__name__)

SERVICE = "v1.PodResourcesLister"
# A node runs at most a few hundred pods; a bound keeps a misbehaving node from flooding
# Prometheus. What is over it is counted in ate_devplugin_pod_units_series_dropped.
MAX_SERIES = 512
# Containers holding units kept per List (the rest only counted as dropped): a bound on
# memory whatever the answer says.
MAX_HELD = 4096
# gRPC's default, set explicitly: a node's real answer (a few hundred pods) is far smaller.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# The Kubernetes limits of these names (DNS label, DNS subdomain, DNS label): a longer
# value is cut to the limit, and counted.
MAX_NAMESPACE_CHARS = 63
MAX_POD_CHARS = 253
MAX_CONTAINER_CHARS = 63
_LIST = f"/{pb.DESCRIPTOR.services_by_name['PodResourcesLister'].full_name}/List"
_REASONS = {grpc.StatusCode.UNAVAILABLE: "unavailable", grpc.StatusCode.DEADLINE_EXCEEDED: "timeout"}

# (resource name, namespace, pod, container)
Key = tuple[str, str, str, str]


class PodResourcesError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of metrics.POD_RESOURCES_RESULTS, never "success"


class DecodeError(Exception):
    """The answer is not a ListPodResourcesResponse."""


@dataclass
class Holdings:
    """What one answer says: units held per container, and what was left out or cut."""

    held: dict[Key, int] = field(default_factory=dict)
    dropped: int = 0  # containers holding units over MAX_HELD
    truncated: int = 0  # containers whose label values were cut


def holdings(answer: bytes | pb.ListPodResourcesResponse, resources: Collection[str]) -> dict[Key, int]:
    """Units of ``resources`` held, per container (pods holding none are left out)."""
    return read_holdings(answer if isinstance(answer, bytes) else answer.SerializeToString(), resources).held


def _number(message: Any, name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


_POD = _number(pb.ListPodResourcesResponse, "pod_resources")
_POD_NAME, _POD_NAMESPACE, _CONTAINERS = (_number(pb.PodResources, n) for n in ("name", "namespace", "containers"))
_CONTAINER_NAME, _DEVICES = (_number(pb.ContainerResources, n) for n in ("name", "devices"))
_RESOURCE, _DEVICE_IDS = (_number(pb.ContainerDevices, n) for n in ("resource_name", "device_ids"))


def read_holdings(data: bytes, resources: Collection[str]) -> Holdings:
    """:func:`holdings` of an encoded answer, walking the wire format (no message is
    built); memory bounded by MAX_HELD whatever the answer. Raises DecodeError."""
    wanted = {r.encode(): r for r in resources}
    found = Holdings()
    for _, pod_start, pod_end in _fields(data, 0, len(data), _POD):
        name = namespace = b""
        containers = []
        for number, start, end in _fields(data, pod_start, pod_end, _POD_NAME, _POD_NAMESPACE, _CONTAINERS):
            if number == _CONTAINERS:
                containers.append((start, end))
            elif number == _POD_NAME:
                name = data[start:end]
            else:
                namespace = data[start:end]
        for c_start, c_end in containers:
            container, units = b"", dict[str, int]()
            for number, start, end in _fields(data, c_start, c_end, _CONTAINER_NAME, _DEVICES):
                if number == _CONTAINER_NAME:
                    container = data[start:end]
                    continue
                resource, count = b"", 0
                for inner, d_start, d_end in _fields(data, start, end, _RESOURCE, _DEVICE_IDS):
                    if inner == _RESOURCE:
                        resource = data[d_start:d_end]
                    else:
                        count += 1
                if count and resource in wanted:
                    units[wanted[resource]] = units.get(wanted[resource], 0) + count
            if units:
                _add(found, _text(namespace), _text(name), _text(container), units)
    return found


def _add(found: Holdings, namespace: str, pod: str, container: str, units: Mapping[str, int]) -> None:
    cut = (namespace[:MAX_NAMESPACE_CHARS], pod[:MAX_POD_CHARS], container[:MAX_CONTAINER_CHARS])
    if cut != (namespace, pod, container):
        found.truncated += 1
    for resource, count in units.items():
        key = (resource, *cut)
        if key in found.held:
            found.held[key] += count
        elif len(found.held) < MAX_HELD:
            found.held[key] = count
        else:
            found.dropped += 1


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("a name that is not UTF-8") from exc


def _fields(data: bytes, pos: int, end: int, *numbers: int) -> Iterator[tuple[int, int, int]]:
    """(number, start, end) of the length-delimited fields ``numbers`` in ``data[pos:end]``;
    every other field is skipped."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        wire_type = key & 7
        if wire_type == 2:  # length-delimited: strings, bytes, messages, packed numbers
            length, pos = _varint(data, pos, end)
            start, pos = pos, pos + length
            if pos > end:
                raise DecodeError("a field runs past its message")
            if key >> 3 in numbers:
                yield key >> 3, start, pos
        elif wire_type == 0:
            _, pos = _varint(data, pos, end)
        elif wire_type in (1, 5):  # 64 and 32 bits
            pos += 8 if wire_type == 1 else 4
        else:
            raise DecodeError(f"wire type {wire_type}")
    if pos != end:
        raise DecodeError("a field runs past its message")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise DecodeError("a truncated or overlong varint")


def asks_for_list(batch: Iterable[FsEvent], checkpoint: str | None, socket: str) -> bool:
    """Whether a batch may have changed the pods holding units: the device manager's
    checkpoint rewritten (a temporary file renamed over it, or written in place), or the
    PodResources socket made anew (a kubelet restart)."""
    for e in batch:
        target = e.dest_path if e.kind == "moved" else e.path
        if checkpoint and target == checkpoint and e.kind in ("moved", "created", "closed"):
            return True
        if e.kind in ("created", "moved") and target == socket:
            return True
    return False


def pods_of(held: Mapping[Key, int], resource: str) -> list[str]:
    """``namespace/pod`` of every pod holding units of ``resource``, sorted."""
    return sorted({f"{ns}/{pod}" for (r, ns, pod, _) in held if r == resource})


@dataclass(frozen=True)
class Lost:
    """A resource whose devices went away, to be reported with the pods that held it."""

    resource: str
    cause: Context | None  # the trace context of the device change


class PodResourcesWatch:
    """Keeps the pod-holding series of the daemon's resources up to date."""

    name = "pod resources"

    def __init__(
        self,
        settings: PodResourcesSettings,
        metrics: PodResourcesMetrics,
        tracer: Tracer,
        health: Callable[[], Mapping[str, str]],
    ) -> None:
        """``health`` gives the advertised health of every resource served, by name."""
        self.socket_path = settings.socket
        self.checkpoint = settings.checkpoint
        self.metrics = metrics
        self.tracer = tracer
        self._health = health
        self.interval_s = settings.interval_s
        self.debounce_s = settings.debounce_s
        self.timeout_s = settings.timeout_s
        self.held: dict[Key, int] = {}
        self._worker = Worker("pod resources answer")
        self._listed = False  # a List has answered
        self._exported: set[Key] = set()
        self._resources: set[str] = set()  # resources with per-resource series
        self._wanted = asyncio.Event()
        self._lost: list[Lost] = []
        self._failure: str | None = None  # the failure reported last, to report each once
        self.task: asyncio.Task[None] | None = None

    # --- the component ----------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        """The first List at once: started last (runtime.components), its first step comes
        after the first discovery, so it sees the devices' health."""
        self._wanted.set()
        self.task = guard.spawn("pod_resources", self._run(), "pod resources")

    async def stop(self, deadline_s: float) -> list[str]:
        return [] if await cancel(self.task, deadline_s) else ["pod resources"]

    def readiness(self) -> tuple[bool, str]:
        return True, ""  # never holds up readiness: it only reports

    def liveness(self) -> tuple[bool, str]:
        return True, ""

    def watches(self) -> Watches:
        # The kubelet makes its PodResources socket anew when it restarts; the checkpoint
        # is in the device plugin's directory, where nothing else concerns us.
        pod_dir = os.path.dirname(self.socket_path)
        return Watches(
            dirs=frozenset({pod_dir} if os.path.isdir(pod_dir) else ()),
            files=frozenset({self.checkpoint} if self.checkpoint else ()),
        )

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        if asks_for_list(batch, self.checkpoint, self.socket_path):
            self.refresh()

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self.refresh()  # the series of resources added or gone

    def on_discovery(self, found: Mapping[str, Discovery]) -> None:
        pass  # health changes come from the device plugin (health_changed)

    # --- told by the device plugin ----------------------------------------------------

    def refresh(self) -> None:
        """Something may have changed the pods holding units: list again soon."""
        self._wanted.set()

    def health_changed(self, resource: str, health: str, cause: Context | None) -> None:
        """Updates the pods-on-an-unhealthy-device count at once, and lists again; a loss
        is reported (log line, span event) with the pods of that List."""
        if health == UNHEALTHY:
            self._lost.append(Lost(resource, cause))
        self._publish_resources()
        self.refresh()

    # --- running ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._next_request()
            self._wanted.clear()
            try:
                await self.list_once()
            except Exception:
                # Whatever it was, the next List may go better; the device plugin goes on.
                log.exception("listing pod resources failed")
                self.metrics.requests.labels("error").inc()
            # Everything asking meanwhile is served by one List after this.
            await asyncio.sleep(self.debounce_s)

    async def _next_request(self) -> None:
        """Until asked, or until the fallback interval passed (0: only when asked)."""
        wait = asyncio.ensure_future(self._wanted.wait())
        try:
            await asyncio.wait({wait}, timeout=self.interval_s or None)
        finally:
            wait.cancel()

    async def list_once(self) -> None:
        """One List; updates the series, and reports the devices lost since the last one."""
        lost, self._lost = self._lost, []
        health = self._health()
        parent = next((x.cause for x in lost if x.cause is not None), None)
        start = time.perf_counter()
        with rpc_span(self.tracer, SERVICE, "List", SpanKind.CLIENT, parent) as span:
            try:
                found = await self._read(await self._list(), health)
            except PodResourcesError as exc:
                self.metrics.requests.labels(exc.reason).inc()
                set_rpc_status(span, grpc.StatusCode.UNKNOWN.value[0], exc.reason, str(exc))
                self._failed(exc)
                self._lost = lost + self._lost  # report them with the next List that works
                return
            finally:
                self.metrics.duration.observe(time.perf_counter() - start)
            set_rpc_status(span, grpc.StatusCode.OK.value[0], "OK")
            self.metrics.requests.labels("success").inc()
            if self._failure is not None:
                log.info("PodResources answers again", extra={"socket": self.socket_path})
                self._failure = None
            self.held = found.held
            self._listed = True
            self._publish(health, found)
            for x in lost:
                if health.get(x.resource) == UNHEALTHY:  # not back meanwhile
                    self._report_loss(x.resource, span)

    async def _read(self, data: bytes, resources: Collection[str]) -> Holdings:
        """The answer read in a worker thread: the loop (and every Allocate) goes on meanwhile."""
        try:
            return await self._worker.call(lambda: read_holdings(data, resources), self.timeout_s)
        except DecodeError as exc:
            raise PodResourcesError("error", f"List at {self.socket_path}: an undecodable answer: {exc}") from exc
        except (TimeoutError, WorkerBusyError) as exc:
            raise PodResourcesError("timeout", f"List at {self.socket_path}: reading the answer: {exc}") from exc

    async def _list(self) -> bytes:
        """One List on a channel of its own: a kubelet restarted meanwhile is dialled afresh,
        and nothing stays connected between Lists (an open channel costs idle CPU)."""
        if not os.path.exists(self.socket_path):  # no kubelet (yet): no channel to set up in vain
            raise PodResourcesError("unavailable", f"List at {self.socket_path}: no such socket")
        # The kubelet's own clients send localhost, not the socket path, as :authority. A
        # subchannel of its own: gRPC would otherwise share one across channels, with the
        # reconnect backoff of a socket that was gone.
        options = [
            ("grpc.default_authority", "localhost"),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
        ]
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}", options=options) as channel:
            # The answer's bytes, not a message: read_holdings reads them (off the loop).
            list_call = channel.unary_unary(
                _LIST, request_serializer=pb.ListPodResourcesRequest.SerializeToString, response_deserializer=None
            )
            try:
                response: bytes = await list_call(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                raise PodResourcesError(
                    _REASONS.get(code, "error"), f"List at {self.socket_path}: {code.name}: {exc.details()}"
                ) from exc
        return response

    def _failed(self, exc: PodResourcesError) -> None:
        if str(exc) != self._failure:  # the same failure again and again is logged once
            self._failure = str(exc)
            log.warning("cannot list pod resources: %s", exc, extra={"socket": self.socket_path})

    # --- series -------------------------------------------------------------------------

    def _publish(self, health: Mapping[str, str], found: Holdings) -> None:
        m = self.metrics
        keys = sorted(self.held)
        kept = set(keys[:MAX_SERIES])
        for key in self._exported - kept:
            m.pod_units.remove(*key)
        for key in kept:
            m.pod_units.labels(*key).set(self.held[key])
        self._exported = kept
        m.series_dropped.set(len(keys) - len(kept) + found.dropped)
        m.labels_truncated.set(found.truncated)
        self._publish_resources(health)

    def _publish_resources(self, health: Mapping[str, str] | None = None) -> None:
        """Per resource: pods holding units, and those of them on an unhealthy device
        (none before a List answered: no count is better than a false 0)."""
        if not self._listed:
            return
        health = self._health() if health is None else health
        m = self.metrics
        for gone in self._resources - health.keys():
            m.pods_holding.remove(gone)
            m.pods_on_unhealthy_device.remove(gone)
        self._resources = set(health)
        for resource, state in health.items():
            pods = len(pods_of(self.held, resource))
            m.pods_holding.labels(resource).set(pods)
            m.pods_on_unhealthy_device.labels(resource).set(pods if state == UNHEALTHY else 0)

    def _report_loss(self, resource: str, span: Span) -> None:
        pods = pods_of(self.held, resource)
        span.add_event(
            "device lost",
            {"ate_devplugin.resource_name": resource, "ate_devplugin.pods": pods, "ate_devplugin.pod_count": len(pods)},
        )
        if pods:
            log.warning(
                "device lost while pods hold its units: %s",
                ", ".join(pods),
                extra={"resource": resource, "pods": pods},
            )
        else:
            log.info("device lost; no pod holds its units", extra={"resource": resource, "pods": pods})
