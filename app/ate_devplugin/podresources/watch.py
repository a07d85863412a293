"""The PodResources component: which pods hold units of the daemon's resources, kept up to date.

The API (v1: List, GetAllocatableResources, Get) has no watch, so the daemon lists again
when something may have changed: the kubelet's device manager rewrote its checkpoint (it
does after every allocation to a container and after every device list a plugin sends;
heard by ``rewrites``, once per List), our DRA driver answered a prepare or unprepare, one
of our resources' devices came or went, or the PodResources socket was made anew. Freeing
a deleted pod's units writes no checkpoint: the fallback interval bounds how long its
series outlives it. Requests are coalesced: the first lists at once, those that come
meanwhile make one more List ``gap_s`` after it. The first List follows the first view
(view.py), so it knows which resources' devices are present and healthy, whatever order the
components started in.

Whether a resource's devices are present and healthy comes from the view, as the device
plugin and the DRA driver say it (absent, or failing the KVM probe, is unhealthy); when
they go, the pods that held units are reported with the next List (a log line, and an
event on its span, a child of the device plugin's ``device change`` when there is one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.watcher import FsEvent, Watches
from ate_devplugin.observability.logs import SaidOnce
from ate_devplugin.observability.metrics import PodResourcesMetrics
from ate_devplugin.observability.tracing import rpc_span, set_rpc_status
from ate_devplugin.podresources.answer import DecodeError, Holdings, Key, Reader, Wanted
from ate_devplugin.podresources.lister import SERVICE, PodResourcesError, list_pods
from ate_devplugin.podresources.rewrites import Rewrites
from ate_devplugin.settings import PodResourcesSettings
from ate_devplugin.tasks import Guard, Worker, WorkerBusyError, cancel
from ate_devplugin.view import View

log = logging.getLogger(__name__)

# A node runs at most a few hundred pods; a bound keeps a misbehaving node from flooding
# Prometheus. What is over it is counted in ate_devplugin_pod_units_series_dropped.
MAX_SERIES = 512


@dataclass(frozen=True)
class DraDevices:
    """Our DRA driver's name and, asked at each List, every device it may publish, by name,
    with its resource: the claims the kubelet reports are counted by them."""

    driver: str
    devices: Callable[[], Mapping[str, str]]


def asks_for_list(batch: Iterable[FsEvent], socket: str) -> bool:
    """Whether a batch of the daemon's may have changed the pods holding units: the
    PodResources socket made anew (a kubelet restart). The checkpoint's rewrites are
    heard apart (``rewrites``)."""
    return any(e.kind in ("created", "moved") and (e.dest_path or e.path) == socket for e in batch)


class Health(NamedTuple):
    """What the pods' series follow of a resource's view."""

    present: bool
    healthy: bool


def _was_present(health: Mapping[str, Health], resource: str) -> bool:
    return resource in health and health[resource].present


def pods_of(held: Mapping[Key, int], resource: str) -> list[str]:
    """``namespace/pod`` of every pod holding units of ``resource``, sorted."""
    return sorted({f"{ns}/{pod}" for (r, ns, pod, _) in held if r == resource})


class PodResourcesWatch:
    """Keeps the pod-holding series of the daemon's resources up to date."""

    name = "pod resources"

    def __init__(
        self,
        settings: PodResourcesSettings,
        metrics: PodResourcesMetrics,
        tracer: Tracer,
        *,
        cause_of: Callable[[str], Context | None] = lambda resource: None,
        dra: DraDevices | None = None,
    ) -> None:
        """``cause_of`` gives the trace context of a resource's last device change (the
        device plugin's), ``dra`` our DRA driver's devices (None: no DRA driver)."""
        self.socket_path = settings.pod_resources_socket
        # The device manager's checkpoint, in the plugin directory (None: no device plugin).
        checkpoint = settings.checkpoint
        self._rewrites = Rewrites(os.path.dirname(checkpoint), self.refresh) if checkpoint else None
        self.metrics = metrics
        self.tracer = tracer
        self._cause_of = cause_of
        self._dra = dra
        self.interval_s = settings.pod_resources_interval
        self.debounce_s = settings.pod_resources_debounce_s
        self.gap_s = settings.pod_resources_gap_s
        self.timeout_s = settings.pod_resources_timeout_s
        self.held: dict[Key, int] = {}
        self._reader = Reader()  # used by the worker alone, one answer at a time
        self._worker = Worker("pod resources answer")
        self._names: frozenset[str] = frozenset()  # the configured resources
        self._health: dict[str, Health] = {}  # resource -> its devices, as last viewed
        self._viewed = False
        self._listed = False  # a List has answered
        self._exported: dict[Key, int] = {}  # the pod_units series, as last set
        self._published: set[str] = set()  # resources with per-resource series
        self._wanted = asyncio.Event()
        self._not_before = 0.0  # loop time before which no List starts
        self._lost: list[str] = []  # resources whose devices went, to report with the next List
        self._failures = SaidOnce()
        self.task: asyncio.Task[None] | None = None

    # --- the component ----------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        """The first List comes with the first view."""
        self._names = frozenset(r.name for r in resources)
        if self._rewrites is not None:
            self._rewrites.start()
        self.task = guard.spawn("pod_resources", self._run(), "pod resources")

    async def stop(self, deadline_s: float) -> list[str]:
        stopped = await cancel(self.task, deadline_s)
        if self._rewrites is not None:
            self._rewrites.stop()
        return [] if stopped else ["pod resources"]

    def watches(self) -> Watches:
        # The kubelet makes its PodResources socket anew when it restarts.
        pod_dir = os.path.dirname(self.socket_path)
        return Watches(dirs=frozenset({pod_dir} if os.path.isdir(pod_dir) else ()))

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        if asks_for_list(batch, self.socket_path):
            self.refresh()

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self._names = frozenset(r.name for r in resources)
        self.refresh()  # the series of resources added or gone

    def on_view(self, view: View) -> None:
        """The first view asks for the first List; a resource whose devices came, went or
        changed health updates the pods-on-an-unhealthy-device count at once and asks for a
        List, which reports a loss with its pods."""
        health = {name: Health(v.present, v.healthy) for name, v in view.items()}
        first, before, self._health = not self._viewed, self._health, health
        self._viewed = True
        changed = {name for name, h in health.items() if before.get(name) != h}
        self._lost += [name for name in sorted(changed) if not health[name].present and _was_present(before, name)]
        if changed and not first:
            self._publish_resources()
        if first or changed or health.keys() != before.keys():
            self.refresh()

    # --- told by the others -----------------------------------------------------------

    def refresh(self) -> None:
        """Something may have changed the pods holding units: list again soon."""
        self._wanted.set()

    def on_claims_changed(self) -> None:
        """Our DRA driver answered a prepare or unprepare: the kubelet records the answer
        once it has it, so the List waits ``debounce_s``."""
        self._not_before = max(self._not_before, asyncio.get_running_loop().time() + self.debounce_s)
        self._wanted.set()

    # --- running ------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._next_request()
            if (wait := self._not_before - loop.time()) > 0:
                await asyncio.sleep(wait)
            self._wanted.clear()
            try:
                await self.list_once()
            except Exception:
                # Whatever it was, the next List may go better; the device plugin goes on.
                log.exception("listing pod resources failed")
                self.metrics.requests.labels("error").inc()
            # Everything asking within gap_s is served by one List then; nothing asking,
            # nothing wakes.
            self._not_before = max(self._not_before, loop.time() + self.gap_s)

    async def _next_request(self) -> None:
        """Until asked, or until the fallback interval passed (0: only when asked)."""
        wait = asyncio.ensure_future(self._wanted.wait())
        try:
            await asyncio.wait({wait}, timeout=self.interval_s or None)
        finally:
            wait.cancel()

    async def list_once(self) -> None:
        """One List; updates the series, and reports the devices lost since the last one."""
        if self._rewrites is not None:
            self._rewrites.arm()  # before the call: a rewrite it may miss asks for the next
        lost, self._lost = self._lost, []
        health = dict(self._health)
        parent = next((c for c in map(self._cause_of, lost) if c is not None), None)
        start = time.perf_counter()
        with rpc_span(self.tracer, SERVICE, "List", SpanKind.CLIENT, parent) as span:
            try:
                found = await self._read(await list_pods(self.socket_path, self.timeout_s), self._wanted_now())
            except PodResourcesError as exc:
                self.metrics.requests.labels(exc.reason).inc()
                set_rpc_status(span, grpc.StatusCode.UNKNOWN.value[0], exc.reason, str(exc))
                if self._failures.new(str(exc)):  # the same failure again and again is logged once
                    log.warning("cannot list pod resources: %s", exc, extra={"socket": self.socket_path})
                self._lost = lost + self._lost  # report them with the next List that works
                return
            finally:
                self.metrics.duration.observe(time.perf_counter() - start)
            set_rpc_status(span, grpc.StatusCode.OK.value[0], "OK")
            self.metrics.requests.labels("success").inc()
            if self._failures.over():
                log.info("PodResources answers again", extra={"socket": self.socket_path})
            self.held = found.held
            self._listed = True
            self._publish(health, found)
            for resource in lost:
                if resource in health and not health[resource].present:  # not back meanwhile
                    self._report_loss(resource, span)

    def _wanted_now(self) -> Wanted:
        """What of the answer is ours, as configured now (read on the loop)."""
        if self._dra is None:
            return Wanted(self._names)
        return Wanted(self._names, self._dra.driver, dict(self._dra.devices()))

    async def _read(self, data: bytes, wanted: Wanted) -> Holdings:
        """The answer read in a worker thread: the loop (and every Allocate) goes on meanwhile."""
        try:
            return await self._worker.call(lambda: self._reader.read(data, wanted), self.timeout_s)
        except DecodeError as exc:
            raise PodResourcesError("error", f"List at {self.socket_path}: an undecodable answer: {exc}") from exc
        except (TimeoutError, WorkerBusyError) as exc:
            raise PodResourcesError("timeout", f"List at {self.socket_path}: reading the answer: {exc}") from exc

    # --- series -------------------------------------------------------------------------

    def _publish(self, health: Mapping[str, Health], found: Holdings) -> None:
        m = self.metrics
        keys = sorted(self.held)
        kept = {key: self.held[key] for key in keys[:MAX_SERIES]}
        for key in self._exported.keys() - kept.keys():
            m.pod_units.remove(*key)
        for key, units in kept.items():
            if self._exported.get(key) != units:  # only what changed since the last List
                m.pod_units.labels(*key).set(units)
        self._exported = kept
        m.series_dropped.set(len(keys) - len(kept) + found.dropped)
        m.labels_truncated.set(found.truncated)
        self._publish_resources(health)

    def _publish_resources(self, health: Mapping[str, Health] | None = None) -> None:
        """Per resource: pods holding units, and those of them on an unhealthy device
        (none before a List answered: no count is better than a false 0)."""
        if not self._listed:
            return
        health = self._health if health is None else health
        m = self.metrics
        for gone in self._published - health.keys():
            m.pods_holding.remove(gone)
            m.pods_on_unhealthy_device.remove(gone)
        self._published = set(health)
        holding: dict[str, set[tuple[str, str]]] = {}
        for resource, namespace, pod, _ in self.held:
            holding.setdefault(resource, set()).add((namespace, pod))
        for resource, h in health.items():
            pods = len(holding.get(resource, ()))
            m.pods_holding.labels(resource).set(pods)
            m.pods_on_unhealthy_device.labels(resource).set(0 if h.healthy else pods)

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
