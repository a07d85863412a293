"""Settings resolved, and the frozen part each subsystem is handed.

A part's fields are named after what fills them: an option's key (options.py) or a
:class:`Timing` field. :data:`PARTS` says, for each part, how it is filled, field by field:
``settings.part(DraSettings)`` builds it. A new option reaches its subsystem by a field in
that subsystem's part and a line in its builder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from ate_devplugin.config import Problem, ResourceConfig, socket_name
from ate_devplugin.settings.idle import idle_fields
from ate_devplugin.settings.options import DRA_DRIVER, KUBELET_SOCKET

P = TypeVar("P")

# Written by the kubelet's device manager in the plugin directory.
CHECKPOINT = "kubelet_internal_checkpoint"


@dataclass(frozen=True)
class Timing:
    """The lifecycle's timing knobs, in seconds: not options, in one place so that tests can
    shrink them. Bounds that belong to one protocol or peer (how long the API server, the
    kubelet or a prober is given) are constants beside the code that speaks to it."""

    # Registered but the kubelet opened no stream (or dropped it) without restarting:
    # wait this long for a restart before registering again.
    stream_grace_s: float = 5.0
    # The kubelet dials us back within Register with a 10 s timeout; allow it that and a margin.
    register_timeout_s: float = 12.0
    backoff_initial_s: float = 0.02
    backoff_cap_s: float = 30.0
    # gRPC server stop: grace for open calls, then this margin before giving up on it.
    server_stop_grace_s: float = 1.0
    server_stop_margin_s: float = 0.5
    # Stopping one agent (its task, then its server) takes at most this long.
    agent_stop_s: float = 2.5
    # Reading and decoding a changed config file, in a worker thread.
    reload_timeout_s: float = 5.0
    # ... once its new content stayed the same this long (a torn write is not judged).
    reload_settle_s: float = 0.2
    # A batch of events not handled within this long is a stall: /healthz fails.
    event_deadline_s: float = 10.0
    # After a stop signal: agents, watcher and server are down within this long ...
    shutdown_deadline_s: float = 3.0
    # ... then the HTTP endpoint closed and spans flushed, side by side, within this long:
    # 4.5 s in all, within the 5 s docs/operations.md promises (the chart grants 10 s).
    close_s: float = 1.5
    # PodResources: a List waits this long after the DRA driver's prepare or unprepare (the
    # kubelet records the answer once it has it); at most one List this often while requests
    # keep coming (a burst of admissions: each List costs about as much CPU as a few
    # admissions, bench.pod_attribution); each List this long at most.
    pod_resources_debounce_s: float = 0.5
    pod_resources_gap_s: float = 2.0
    pod_resources_timeout_s: float = 5.0


@dataclass(frozen=True)
class RuntimeSettings:
    """The composition root's part: what it loads, serves and logs, and in which mode."""

    config: Path | None
    plugin_dir: str
    socket_suffix: str
    metrics_address: tuple[str, int]
    log_format: str
    log_level: str
    cdi_dir: str
    mode: str
    pod_resources: bool
    reload_timeout_s: float
    reload_settle_s: float
    close_s: float

    @property
    def dra(self) -> bool:
        return self.mode != "device-plugin"


@dataclass(frozen=True)
class DevicePluginSettings:
    """The device plugin's part: the kubelet's socket directory and the agents' timing."""

    plugin_dir: str
    socket_suffix: str
    stream_grace_s: float
    register_timeout_s: float
    backoff_initial_s: float
    backoff_cap_s: float
    server_stop_grace_s: float
    server_stop_margin_s: float
    agent_stop_s: float
    mode: str = "device-plugin"
    kvm_probe: str = "local"

    @property
    def serves_resources(self) -> bool:
        """The configured resources (not in mode dra, where the DRA driver serves them)."""
        return self.mode != "dra"

    @property
    def serves_probers(self) -> bool:
        """With the prober (socket mode), its resource beside each probed one, in every mode."""
        return self.kvm_probe == "socket"

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    def socket_path(self, resource: ResourceConfig) -> str:
        return os.path.join(self.plugin_dir, socket_name(resource.name, self.socket_suffix))


@dataclass(frozen=True)
class PodResourcesSettings:
    """Which pods hold units: the kubelet's PodResources socket, how often to List without
    being asked, and (with the device plugin) the device manager's checkpoint whose rewrites ask."""

    pod_resources_socket: str
    pod_resources_interval: float
    pod_resources_debounce_s: float
    pod_resources_gap_s: float
    pod_resources_timeout_s: float
    plugin_dir: str
    mode: str

    @property
    def checkpoint(self) -> str | None:
        """Rewritten when units are allocated; None without the device plugin, whose
        directory nothing else watches (the chart mounts it only then)."""
        return os.path.join(self.plugin_dir, CHECKPOINT) if self.mode != "dra" else None


@dataclass(frozen=True)
class DraSettings:
    """The DRA driver's part: this node, the kubelet's plugin directories, how devices are shared."""

    node_name: str
    registry_dir: str
    dra_dir: str
    dra_slots: int
    dra_sharing: str
    dra_taint_effect: str = "NoSchedule"
    driver: str = DRA_DRIVER

    @property
    def socket(self) -> str:
        return os.path.join(self.dra_dir, "dra.sock")

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver}-reg.sock")


@dataclass(frozen=True)
class KvmHealthSettings:
    """The KVM probe's part: where the devices are found, how often and how long each probe."""

    device_root: str
    kvm_probe: str
    kvm_probe_period: float
    kvm_probe_timeout: float
    kvm_probe_socket: str
    kvm_prober_uid: int
    kvm_prober_gid: int
    nfd_features_dir: str
    nfd_label_ttl: float

    @property
    def prober_grace_s(self) -> float:
        """Socket mode: a prober away this long (three periods) takes its verdicts with it."""
        return 3 * (self.kvm_probe_period or self.kvm_probe_timeout)


@dataclass(frozen=True)
class DaemonSettings:
    """The supervisor's part: where devices are found, and its deadlines."""

    device_root: str
    event_deadline_s: float
    shutdown_deadline_s: float


@dataclass(frozen=True)
class Settings:
    """Every option's value (by key), the timing, and the options given that do nothing
    here; each subsystem is handed only its own part (:meth:`part`)."""

    values: Mapping[str, Any]
    timing: Timing = field(default_factory=Timing)
    idle: tuple[Problem, ...] = ()

    def part(self, cls: type[P]) -> P:
        """The part ``cls`` of these settings (one of :data:`PARTS`)."""
        build = PARTS.get(cls)
        if build is None:
            raise TypeError(f"{cls.__name__} is not a settings part: add its builder to PARTS")
        return cast(P, build(self.values, self.timing))

    def warnings(self, resources: Sequence[ResourceConfig]) -> list[Problem]:
        """What was set but does nothing here: these settings, then the config's fields."""
        return [*self.idle, *idle_fields(resources, self.values["mode"])]


Values = Mapping[str, Any]


def _runtime(v: Values, t: Timing) -> RuntimeSettings:
    return RuntimeSettings(
        config=v["config"],
        plugin_dir=v["plugin_dir"],
        socket_suffix=v["socket_suffix"],
        metrics_address=v["metrics_address"],
        log_format=v["log_format"],
        log_level=v["log_level"],
        cdi_dir=v["cdi_dir"],
        mode=v["mode"],
        pod_resources=v["pod_resources"],
        reload_timeout_s=t.reload_timeout_s,
        reload_settle_s=t.reload_settle_s,
        close_s=t.close_s,
    )


def _device_plugin(v: Values, t: Timing) -> DevicePluginSettings:
    return DevicePluginSettings(
        plugin_dir=v["plugin_dir"],
        socket_suffix=v["socket_suffix"],
        stream_grace_s=t.stream_grace_s,
        register_timeout_s=t.register_timeout_s,
        backoff_initial_s=t.backoff_initial_s,
        backoff_cap_s=t.backoff_cap_s,
        server_stop_grace_s=t.server_stop_grace_s,
        server_stop_margin_s=t.server_stop_margin_s,
        agent_stop_s=t.agent_stop_s,
        mode=v["mode"],
        kvm_probe=v["kvm_probe"],
    )


def _pod_resources(v: Values, t: Timing) -> PodResourcesSettings:
    return PodResourcesSettings(
        pod_resources_socket=v["pod_resources_socket"],
        pod_resources_interval=v["pod_resources_interval"],
        pod_resources_debounce_s=t.pod_resources_debounce_s,
        pod_resources_gap_s=t.pod_resources_gap_s,
        pod_resources_timeout_s=t.pod_resources_timeout_s,
        plugin_dir=v["plugin_dir"],
        mode=v["mode"],
    )


def _dra(v: Values, t: Timing) -> DraSettings:
    return DraSettings(
        node_name=v["node_name"],
        registry_dir=v["registry_dir"],
        dra_dir=v["dra_dir"],
        dra_slots=v["dra_slots"],
        dra_sharing=v["dra_sharing"],
        dra_taint_effect=v["dra_taint_effect"],
    )


def _kvm_health(v: Values, t: Timing) -> KvmHealthSettings:
    return KvmHealthSettings(
        device_root=v["device_root"],
        kvm_probe=v["kvm_probe"],
        kvm_probe_period=v["kvm_probe_period"],
        kvm_probe_timeout=v["kvm_probe_timeout"],
        kvm_probe_socket=v["kvm_probe_socket"],
        kvm_prober_uid=v["kvm_prober_uid"],
        kvm_prober_gid=v["kvm_prober_gid"],
        nfd_features_dir=v["nfd_features_dir"],
        nfd_label_ttl=v["nfd_label_ttl"],
    )


def _daemon(v: Values, t: Timing) -> DaemonSettings:
    return DaemonSettings(
        device_root=v["device_root"],
        event_deadline_s=t.event_deadline_s,
        shutdown_deadline_s=t.shutdown_deadline_s,
    )


# Every part, and how it is filled from the options' values and the timing.
PARTS: Mapping[type[Any], Callable[[Values, Timing], object]] = {
    RuntimeSettings: _runtime,
    DevicePluginSettings: _device_plugin,
    PodResourcesSettings: _pod_resources,
    DraSettings: _dra,
    KvmHealthSettings: _kvm_health,
    DaemonSettings: _daemon,
}
