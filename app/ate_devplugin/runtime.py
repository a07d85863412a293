"""The composition root: every real implementation is built here from Settings, and run.

cli.py parses the command line into Settings and calls :func:`run`. Each subsystem gets
only its own part of the settings, computed once. The DRA driver and its Kubernetes client
are imported only in mode dra or both: device-plugin mode loads neither; the PodResources
watch only with --pod-resources on.

Exit codes: 0 done, 1 runtime failure, 2 bad configuration (a line per problem, no traceback).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import grpc
from prometheus_client import disable_created_metrics

from ate_devplugin import config
from ate_devplugin.components import Component, Readiness, Resources
from ate_devplugin.config import ConfigError, config_error
from ate_devplugin.daemon import Daemon
from ate_devplugin.deviceplugin.inventory import ResourceState
from ate_devplugin.deviceplugin.plugin import DevicePlugin
from ate_devplugin.deviceplugin.ports import GrpcKubelet, HostFilesystem, Ports, SystemClock
from ate_devplugin.deviceplugin.server import plugin_server
from ate_devplugin.deviceplugin.servicer import DevicePluginServicer
from ate_devplugin.host import cdi, devices
from ate_devplugin.host.sockets import ServeError, UnixServer
from ate_devplugin.observability.http import HttpServer
from ate_devplugin.observability.logs import setup_logging
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.observability.tracing import Tracing, setup_tracing
from ate_devplugin.reload import ConfigReader
from ate_devplugin.settings import (
    DRA_DRIVER,
    DaemonSettings,
    DevicePluginSettings,
    DraSettings,
    KvmHealthSettings,
    PodResourcesSettings,
    RuntimeSettings,
    Settings,
)
from ate_devplugin.tasks import TaskDiedError

if TYPE_CHECKING:
    from ate_devplugin.dra.plugin import ApiServer

log = logging.getLogger("ate_devplugin")

EXIT_RUNTIME = 1
RELOAD_SIGNALS = (signal.SIGHUP,)
# Writes the daemon's state to the log (log_state), as operators expect of a daemon.
STATE_SIGNALS = (signal.SIGUSR1,)
# Every catchable signal whose default would end the process: each stops it cleanly, so
# no stale socket stays behind. (Faults like SIGSEGV and the uncatchable SIGKILL aside.)
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGPWR,
    signal.SIGXCPU,
    signal.SIGSTKFLT,
)


def run(settings: Settings) -> int:
    """Loads the resources (and, with DRA, the API server's credentials), then serves until stopped."""
    part = settings.part(RuntimeSettings)
    try:
        resources = config.load(part.config, part.plugin_dir, part.socket_suffix)
        kube = None
        if part.dra:
            from ate_devplugin.dra.kube import connect  # device-plugin mode loads no Kubernetes client

            kube = connect()
    except ConfigError as exc:
        return config_error(exc)
    setup_logging(part.log_format, part.log_level)
    for idle in settings.warnings(resources):
        log.warning("%s", idle, extra={"setting": idle.field})
    # The *_created series double the exposition and tell an operator nothing here.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus-client
    try:
        asyncio.run(serve(settings, resources, kube))
    except (OSError, ServeError, TaskDiedError) as exc:
        log.error("cannot run: %s", exc)
        return EXIT_RUNTIME
    return 0


async def serve(settings: Settings, resources: Resources, kube: ApiServer | None = None) -> None:
    loop = asyncio.get_running_loop()
    # Hold gRPC's asyncio runtime for the whole run: when its last server goes, gRPC shuts
    # its poller down from inside the loop, blocking it while a write to a peer that
    # stopped reading is pending.
    grpc.aio.init_grpc_aio()  # type: ignore[attr-defined]  # missing from grpc-stubs
    metrics = Metrics(revision=os.environ.get("ATE_DEVPLUGIN_REVISION", "unknown"))
    tracing = setup_tracing()
    daemon = build(settings, resources, metrics, tracing, kube=kube)
    part = settings.part(RuntimeSettings)
    host, port = part.metrics_address
    http = HttpServer(
        host,
        port,
        metrics.registry,
        loop,
        daemon.readiness,
        daemon.liveness,
        on_death=daemon.guard.for_thread("http", "http endpoint"),
    )
    http.start()
    log.info("listening for metrics and probes", extra={"address": f"{host}:{http.port}"})
    # A parent may have left these blocked (the mask is inherited); we must hear them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*STOP_SIGNALS, *RELOAD_SIGNALS, *STATE_SIGNALS})
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, daemon.request_stop, sig.name)
    for sig in RELOAD_SIGNALS:
        loop.add_signal_handler(sig, daemon.request_reload)
    for sig in STATE_SIGNALS:
        loop.add_signal_handler(sig, log_state, daemon)
    try:
        await daemon.run()
    finally:
        _close(http, tracing, part.close_s)
        log.info("stopped")


def log_state(daemon: Daemon) -> None:
    """SIGUSR1: what on-call asks first, in one log record; the daemon goes on."""
    (ready, readiness), (alive, liveness) = daemon.readiness(), daemon.liveness()
    state = {
        "ready": ready,
        "readiness": readiness,
        "alive": alive,
        "liveness": liveness,
        "components": {c.name: c.readiness()[1] or "ready" for c in daemon.components if isinstance(c, Readiness)},
        "resources": {
            name: {
                "devices": [f"{n.host_path} {n.major}:{n.minor}" for n in v.found.nodes],
                "complete": v.present,
                "health": v.why,
            }
            for name, v in daemon.views.last.items()
        },
        "config": str(daemon.reader.path) if daemon.reader else None,
    }
    log.info("state", extra={"state": state})


def build(
    settings: Settings,
    resources: Resources,
    metrics: Metrics,
    tracing: Tracing,
    *,
    kube: ApiServer | None = None,
    ports: Ports | None = None,
    discover: devices.Discover = devices.discover,
) -> Daemon:
    """The daemon and its components; tests pass fake ``ports`` and ``discover``."""
    part = settings.part(RuntimeSettings)
    reader = None
    if part.config is not None:
        reader = ConfigReader(
            part.config, part.plugin_dir, metrics, part.reload_timeout_s, part.reload_settle_s, part.socket_suffix
        )
    specs = cdi.CdiSpecs(part.cdi_dir, metrics, every_resource=kube is not None)
    parts = components(settings, metrics, tracing, kube, ports, specs)
    return Daemon(settings.part(DaemonSettings), resources, parts, metrics, reader, discover)


def components(
    settings: Settings,
    metrics: Metrics,
    tracing: Tracing,
    kube: ApiServer | None,
    ports: Ports | None = None,
    specs: cdi.CdiSpecs | None = None,
) -> list[Component]:
    """What the daemon does in this mode, each handed its own part of the settings. The CDI
    specs are the ones the device plugin's answers (``ports``, the real host's unless given)
    and the DRA driver's ask about. The PodResources watch asks the device plugin for the
    trace context of a device change, and the DRA driver for its devices' names; what one
    component tells the others (the KVM state, the DRA driver's claims) goes through the
    supervisor (components.Notice), and every one renders the supervisor's view (view.py),
    so the order they are built in does not matter."""
    part = settings.part(RuntimeSettings)
    # A DRA driver answers with CDI names only: then every resource needs its spec.
    specs = specs or cdi.CdiSpecs(part.cdi_dir, metrics, every_resource=kube is not None)
    built: list[Component] = []
    built += kvm_health(settings.part(KvmHealthSettings), metrics)
    plugin = None
    plugin_part = settings.part(DevicePluginSettings)
    if plugin_part.serves_resources or plugin_part.serves_probers:
        ports = ports or host_ports(plugin_part, metrics, tracing, specs)
        plugin = DevicePlugin(plugin_part, ports, metrics, tracing.tracer)
        built.append(plugin)
    built.append(specs)
    dra = None
    if kube is not None:
        from ate_devplugin.dra.plugin import DraPlugin
        from ate_devplugin.observability.metrics import DraMetrics

        dra_metrics = DraMetrics(metrics.registry, metrics.health_changed)
        dra = DraPlugin(settings.part(DraSettings), kube, cdi.device_id, dra_metrics, tracing.tracer, specs.cdi_problem)
        built.append(dra)
    if part.pod_resources:
        from ate_devplugin.observability.metrics import PodResourcesMetrics
        from ate_devplugin.podresources.watch import DraDevices, PodResourcesWatch

        pods = PodResourcesWatch(
            settings.part(PodResourcesSettings),
            PodResourcesMetrics(metrics.registry),
            tracing.tracer,
            cause_of=plugin.change_context if plugin is not None else lambda resource: None,
            dra=DraDevices(DRA_DRIVER, dra.device_resources) if dra is not None else None,
        )
        built.append(pods)
    return built


def kvm_health(part: KvmHealthSettings, metrics: Metrics) -> list[Component]:
    """The KVM health component, whoever probes (the daemon itself, the prober pod asked over
    its socket, or nobody: the 10:232 check alone); and with ``--nfd-features-dir`` the feature
    file that renders its state."""
    from ate_devplugin.kvm.facts import read_node_facts
    from ate_devplugin.kvmhealth.health import KvmHealth
    from ate_devplugin.kvmhealth.probes import LocalProbes, NoProbes, Probes
    from ate_devplugin.observability.metrics import KvmMetrics

    kvm_metrics = KvmMetrics(metrics.registry)
    probes: Probes
    if part.kvm_probe == "socket":
        from ate_devplugin.kvmhealth.link import ProberLink

        prober = (part.kvm_prober_uid, part.kvm_prober_gid)
        probes = ProberLink(part.kvm_probe_socket, part.prober_grace_s, prober, kvm_metrics)
    elif part.kvm_probe == "local":
        probes = LocalProbes(part.device_root)
    else:
        probes = NoProbes()
    built: list[Component] = [KvmHealth(part, kvm_metrics, probes, read_node_facts())]
    if part.nfd_features_dir and part.kvm_probe != "off":
        from ate_devplugin.kvmhealth.labels import FeatureFile

        built.append(FeatureFile(part.nfd_features_dir, DRA_DRIVER, part.nfd_label_ttl))
    return built


def host_ports(
    part: DevicePluginSettings, metrics: Metrics, tracing: Tracing, specs: cdi.CdiSpecs | None = None
) -> Ports:
    """The device plugin's ports to the real host and kubelet; Allocate names a CDI device
    only while ``specs`` has its spec on disk."""

    def make_server(state: ResourceState) -> UnixServer:
        servicer = DevicePluginServicer(state, metrics, tracing.tracer, specs.cdi_problem if specs else lambda _: "")
        return plugin_server(part.socket_path(state.config), servicer, part.server_stop_margin_s)

    return Ports(
        fs=HostFilesystem(),
        kubelet=GrpcKubelet(tracing.tracer, part.register_timeout_s),
        clock=SystemClock(),
        make_server=make_server,
    )


def _close(http: HttpServer, tracing: Tracing, deadline_s: float) -> None:
    """Closes the HTTP endpoint and flushes spans side by side, within ``deadline_s`` for
    both: neither a wedged endpoint nor an unreachable collector holds the exit."""
    flush = threading.Thread(target=tracing.shutdown, name="trace flush", daemon=True)
    flush.start()
    end = time.monotonic() + deadline_s
    http.close(deadline_s)
    flush.join(max(0.0, end - time.monotonic()))
