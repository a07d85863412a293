"""Prometheus collectors, on a registry the application owns."""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from ate_devplugin import __version__

PREFIX = "ate_devplugin"
REGISTRATION_RESULTS = ("success", "unavailable", "timeout", "rejected", "error")
HEALTH_LABELS = ("healthy", "unhealthy")
ALLOCATE_CODES = ("OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "INTERNAL")
# event_handling: a batch of events not handled within its deadline; agent_stop: an
# agent's task that did not end when cancelled.
STALL_REASONS = ("event_handling", "agent_stop")
# The kinds of guarded task (tasks.Guard): each runs for as long as the daemon does.
TASK_KINDS = ("agent", "event_router", "http", "pod_resources", "slice_watch", "slice_sync", "kvm_probe", "nfd_renew")
CDI_SPEC_UPDATES = tuple((action, result) for action in ("write", "remove") for result in ("success", "failure"))
# Allocate answers from memory. Measured under the kubelet bench (1,000 admissions, the
# daemon's own time, three runs): p50 16-18 us, p99 58-95 us; 77 us and 200 us traced. From
# 10 us in 1-2.5-5 steps to 2.5 ms resolves that; coarser above (a starved loop), with 0.25 s,
# AteDevpluginAllocateSlow's threshold, a bound. 13 buckets: 16 series per resource, 2 more
# than the 11 from 0.5 ms, under which every call fell (p50 0.25 ms, p99 0.495 ms, whatever it took).
ALLOCATE_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 0.5, 1.0)
# Calls that wait on something else: the DRA driver's (through the kubelet's DRA manager, 200
# claims: NodePrepareResources p50 3.3 ms, p99 7 ms, as it reads the claim from the API server;
# NodeUnprepareResources p50 80 us, p99 250 us) and PodResources List (milliseconds, up to its
# 5 s deadline). From 50 us, to 10 s: past the API calls' 5 s deadline. Series per method, not
# per resource.
CALL_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def health_changed_gauge(registry: CollectorRegistry) -> Gauge:
    """When a resource's device health last changed: the dashboards' "since". One series per
    resource, set by the device plugin and by the DRA driver (both, in mode both)."""
    return Gauge(
        f"{PREFIX}_device_health_last_change_timestamp_seconds",
        "When the health of the resource's devices last changed (the first discovery counts), in seconds "
        "since the epoch; 0 until then.",
        ["resource_name"],
        registry=registry,
    )


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, revision: str = "unknown") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        res = ["resource_name"]
        Info(f"{PREFIX}_build", "Version of the running daemon.", registry=r).info(
            {"version": __version__, "revision": revision, "python_version": platform.python_version()}
        )
        self.registrations = Counter(
            f"{PREFIX}_registrations",
            "Register calls to the kubelet, by result.",
            [*res, "result"],
            registry=r,
        )
        self.registered = Gauge(
            f"{PREFIX}_registered",
            "1 while registered and the kubelet holds the ListAndWatch stream.",
            res,
            registry=r,
        )
        self.kubelet_restarts = Counter(
            f"{PREFIX}_kubelet_restarts", "Times the kubelet socket was created anew.", registry=r
        )
        self.devices = Gauge(f"{PREFIX}_devices", "Advertised units, by health.", [*res, "health"], registry=r)
        self.device_nodes_present = Gauge(
            f"{PREFIX}_device_nodes_present", "Device nodes found for the resource.", res, registry=r
        )
        self.health_changes = Counter(
            f"{PREFIX}_device_health_changes",
            "Changes of the advertised health, by new health.",
            [*res, "health"],
            registry=r,
        )
        self.health_changed = health_changed_gauge(r)
        self.allocate_requests = Counter(
            f"{PREFIX}_allocate_requests",
            "Allocate calls, by gRPC status code.",
            [*res, "code"],
            registry=r,
        )
        self.allocate_duration = Histogram(
            f"{PREFIX}_allocate_duration_seconds",
            "Time to answer an Allocate call.",
            res,
            buckets=ALLOCATE_BUCKETS,
            registry=r,
        )
        self.preferred_allocation_requests = Counter(
            f"{PREFIX}_preferred_allocation_requests", "GetPreferredAllocation calls.", res, registry=r
        )
        self.list_and_watch_updates = Counter(
            f"{PREFIX}_list_and_watch_updates", "Device lists sent to the kubelet.", res, registry=r
        )
        self.list_and_watch_streams = Gauge(
            f"{PREFIX}_list_and_watch_streams", "Open ListAndWatch streams.", res, registry=r
        )
        self.config_reloads = Counter(
            f"{PREFIX}_config_reloads", "Configuration reloads, by result.", ["result"], registry=r
        )
        for result in ("success", "failure"):
            self.config_reloads.labels(result)
        # A level, not only a counter: the alert must hold while the file stays rejected,
        # however long ago the failure was counted.
        self.config_rejected = Gauge(
            f"{PREFIX}_config_rejected",
            "1 while the config file on disk is rejected and the daemon runs its previous config.",
            registry=r,
        )
        self.lifecycle_stalls = Counter(
            f"{PREFIX}_lifecycle_stalls",
            "Times the lifecycle got stuck (and /healthz fails), by reason.",
            ["reason"],
            registry=r,
        )
        for reason in STALL_REASONS:
            self.lifecycle_stalls.labels(reason)
        self.task_failures = Counter(
            f"{PREFIX}_task_failures",
            "Long-running tasks that ended unexpectedly (the daemon then exits 1), by kind.",
            ["task"],
            registry=r,
        )
        for kind in TASK_KINDS:
            self.task_failures.labels(kind)
        # --- CDI specs ---
        self.cdi_spec_updates = Counter(
            f"{PREFIX}_cdi_spec_updates",
            "CDI spec files written or removed, by action and result.",
            [*res, "action", "result"],
            registry=r,
        )
        # --- end CDI specs ---

    def _series(self, name: str) -> list[tuple[MetricWrapperBase, tuple[str, ...]]]:
        """Every labelled series of one resource, as (metric, label values)."""
        return [
            *((self.registrations, (name, result)) for result in REGISTRATION_RESULTS),
            *((m, (name, health)) for health in HEALTH_LABELS for m in (self.devices, self.health_changes)),
            *((self.allocate_requests, (name, code)) for code in ALLOCATE_CODES),
            *((self.cdi_spec_updates, (name, *a)) for a in CDI_SPEC_UPDATES),
            *(
                (m, (name,))
                for m in (
                    self.registered,
                    self.device_nodes_present,
                    self.health_changed,
                    self.allocate_duration,
                    self.preferred_allocation_requests,
                    self.list_and_watch_updates,
                    self.list_and_watch_streams,
                )
            ),
        ]

    def add_resource(self, name: str) -> None:
        """Create every labelled series of a resource at zero."""
        for metric, labels in self._series(name):
            metric.labels(*labels)

    def remove_resource(self, name: str) -> None:
        for metric, labels in self._series(name):
            metric.remove(*labels)

    def remove_cdi_series(self, name: str) -> None:
        """A resource's CDI spec series, once its spec went with it (the device plugin's
        resources lose them with the rest, at remove_resource)."""
        for action, result in CDI_SPEC_UPDATES:
            self.cdi_spec_updates.remove(name, action, result)


# --- the KVM probe (resources with health kvm) -------------------------------------------
KVM_PROBE_STATES = ("unverified", "passed", "failed", "cannot-probe", "prober-gone")
PROBER_REFUSALS = ("identity", "no-hello", "version", "bad-message", "late", "busy")
PROBE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class KvmMetrics:
    """The KVM probe's collectors; series exist only for resources with health kvm."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        res = ["resource_name"]
        self.verdicts = Counter(
            f"{PREFIX}_kvm_probes",
            "KVM probe verdicts, by reason (passed, or why it failed).",
            [*res, "reason"],
            registry=r,
        )
        self.state = Gauge(
            f"{PREFIX}_kvm_probe_state",
            "1 for the resource's probe state, 0 for the others.",
            [*res, "state"],
            registry=r,
        )
        self.reason = Gauge(
            f"{PREFIX}_kvm_probe_reason",
            "1 for the reason of the resource's current verdict (passed, or why it failed), 0 for the others; "
            "all 0 while it has none (unverified, prober-gone).",
            [*res, "reason"],
            registry=r,
        )
        self.restore = Gauge(
            f"{PREFIX}_kvm_restore_answer",
            "1 for whether this node can restore the resource's restore profile: restorable, or the "
            "first reason it cannot (missing-features, tsc, vendor, kvm-implementation, no-cpuid; unknown "
            "before a probe passed); 0 for the others.",
            ["resource_name", "profile", "answer"],
            registry=r,
        )
        self.prober_refused = Counter(
            f"{PREFIX}_kvm_prober_refused",
            "What the prober's socket refused (--kvm-probe socket): a connection of another identity than the "
            "prober's (identity), with no hello in time (no-hello), of another protocol version (version), or past "
            "the probers waiting their turn (busy); a message that is not one of the protocol (bad-message), or a "
            "report that answers no request in flight (late).",
            ["reason"],
            registry=r,
        )
        for why in PROBER_REFUSALS:
            self.prober_refused.labels(why)
        self.duration = Histogram(
            f"{PREFIX}_kvm_probe_duration_seconds",
            "Time a KVM probe took, its worker's start included.",
            res,
            buckets=PROBE_BUCKETS,
            registry=r,
        )

    def add_resource(self, resource: str, reasons: Iterable[str]) -> None:
        """Every series of the resource, at zero (a failure's first count is then an increase)."""
        for reason in reasons:
            self.verdicts.labels(resource, reason)
            self.reason.labels(resource, reason).set(0)
        self.duration.labels(resource)
        self.set_state(resource, "unverified")

    def set_state(self, resource: str, state: str, reasons: Iterable[str] = (), reason: str = "") -> None:
        """The resource's state; with ``reasons``, its reason gauge too: 1 for ``reason`` ("" for none)."""
        for s in KVM_PROBE_STATES:
            self.state.labels(resource, s).set(1 if s == state else 0)
        for r in reasons:
            self.reason.labels(resource, r).set(1 if r == reason else 0)

    def set_restore(self, resource: str, profile: str, answer: str, answers: Iterable[str]) -> None:
        for a in answers:
            self.restore.labels(resource, profile, a).set(1 if a == answer else 0)

    def remove_restore(self, resource: str, profile: str, answers: Iterable[str]) -> None:
        for a in answers:
            self.restore.remove(resource, profile, a)

    def remove_resource(self, resource: str, reasons: Iterable[str]) -> None:
        for s in KVM_PROBE_STATES:
            self.state.remove(resource, s)
        self.duration.remove(resource)
        for reason in reasons:
            self.verdicts.remove(resource, reason)
            self.reason.remove(resource, reason)


# --- DRA driver (mode dra or both) ----------------------------------------------------
DRA_METHODS = ("NodePrepareResources", "NodeUnprepareResources")
DRA_CLAIM_RESULTS = ("success", "error")
DRA_SLICE_OPS = ("create", "update", "delete")


class DraMetrics:
    """The DRA driver's collectors, registered only when DRA is on (device-plugin mode pays nothing).

    ``health_changed``: the gauge of :class:`Metrics` on the same registry (one series per
    resource, whichever side sets it); without it, one of its own (a DRA driver alone).
    """

    def __init__(self, registry: CollectorRegistry, health_changed: Gauge | None = None) -> None:
        r = registry
        self.health_changed = health_changed if health_changed is not None else health_changed_gauge(r)
        self.claims = Counter(
            f"{PREFIX}_dra_claims",
            "Claims handled in NodePrepareResources / NodeUnprepareResources calls, by method and result.",
            ["method", "result"],
            registry=r,
        )
        self.call_duration = Histogram(
            f"{PREFIX}_dra_call_duration_seconds",
            "Time to answer a DRA call from the kubelet, by method.",
            ["method"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.claims_prepared = Gauge(
            f"{PREFIX}_dra_claims_prepared", "Claims prepared on this node and not yet unprepared.", registry=r
        )
        self.registered = Gauge(
            f"{PREFIX}_dra_registered", "1 once the kubelet accepted the DRA driver's registration.", registry=r
        )
        self.slice_devices = Gauge(
            f"{PREFIX}_dra_slice_devices",
            "Devices this node publishes in its ResourceSlices, by resource.",
            ["resource_name"],
            registry=r,
        )
        self.slice_writes = Counter(
            f"{PREFIX}_dra_slice_writes",
            "ResourceSlice writes to the API server, by operation and result.",
            ["op", "result"],
            registry=r,
        )
        self.sharing = Gauge(
            f"{PREFIX}_dra_sharing",
            "1 for the sharing model in use: capacity (a shareable device per resource, plus slots) or slots "
            "(slots only: configured so, or the API server dropped allowMultipleAllocations).",
            ["model"],
            registry=r,
        )
        self.tainted_devices = Gauge(
            f"{PREFIX}_dra_tainted_devices",
            "Devices this node publishes with a taint (the resource failed its KVM probe), by resource.",
            ["resource_name"],
            registry=r,
        )
        self.taints_dropped = Gauge(
            f"{PREFIX}_dra_taints_dropped",
            "1 once the API server was seen dropping device taints (DRADeviceTaints off): devices are "
            "published without them.",
            registry=r,
        )
        self.health_streams = Gauge(
            f"{PREFIX}_dra_health_streams",
            "Device health streams the kubelet holds open (NodeWatchResources), by service version.",
            ["version"],
            registry=r,
        )
        self.slices_in_sync = Gauge(
            f"{PREFIX}_dra_slices_in_sync",
            "1 while the published ResourceSlices match the node's devices, 0 while a write is failing.",
            registry=r,
        )
        for method in DRA_METHODS:
            self.call_duration.labels(method)
            for result in DRA_CLAIM_RESULTS:
                self.claims.labels(method, result)
        for op in DRA_SLICE_OPS:
            for result in ("success", "failure"):
                self.slice_writes.labels(op, result)


# --- pods holding units (podresources/) -----------------------------------------------

POD_RESOURCES_RESULTS = ("success", "unavailable", "timeout", "error")


class PodResourcesMetrics:
    """The series of the PodResources watch (podresources/), on the daemon's registry; made only when it runs.

    ``pod_units`` names pods: bounded by podresources.watch.MAX_SERIES, what is over it counted.
    Its ``namespace``, ``pod`` and ``container`` labels are the consumer's; the chart's
    ServiceMonitor and PodMonitor honour them over the scrape target's.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.pod_units = Gauge(
            f"{PREFIX}_pod_units",
            "Units of the resource a pod's container holds, as the kubelet's PodResources API lists them.",
            ["resource_name", "namespace", "pod", "container"],
            registry=r,
        )
        self.pods_holding = Gauge(
            f"{PREFIX}_pods_holding_units", "Pods holding units of the resource.", ["resource_name"], registry=r
        )
        self.pods_on_unhealthy_device = Gauge(
            f"{PREFIX}_pods_on_unhealthy_device",
            "Pods holding units of the resource while its device nodes are absent (Unhealthy).",
            ["resource_name"],
            registry=r,
        )
        self.series_dropped = Gauge(
            f"{PREFIX}_pod_units_series_dropped",
            "Containers holding units that have no pod_units series: over the bound.",
            registry=r,
        )
        self.labels_truncated = Gauge(
            f"{PREFIX}_pod_units_labels_truncated",
            "Containers of the last List whose namespace, pod or container name was cut to the Kubernetes limit.",
            registry=r,
        )
        self.requests = Counter(
            f"{PREFIX}_pod_resources_requests",
            "PodResources List calls to the kubelet, by result.",
            ["result"],
            registry=r,
        )
        for result in POD_RESOURCES_RESULTS:
            self.requests.labels(result)
        self.duration = Histogram(
            f"{PREFIX}_pod_resources_duration_seconds",
            "Time a PodResources List call took.",
            buckets=CALL_BUCKETS,
            registry=r,
        )
