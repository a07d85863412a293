"""The command line: ``ate-devplugin run | check-config FILE | version``.

Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage (one line, no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from prometheus_client import disable_created_metrics

from ate_devplugin import __version__, config
from ate_devplugin.config import ConfigError, ResourceConfig, load_resources
from ate_devplugin.daemon import AgentDiedError, Daemon
from ate_devplugin.observability.http import HttpServer
from ate_devplugin.observability.logs import setup_logging
from ate_devplugin.observability.metrics import Metrics
from ate_devplugin.observability.tracing import setup_tracing
from ate_devplugin.settings import DEFAULTS, Settings, resolve

if TYPE_CHECKING:
    from ate_devplugin.dra.kube import KubeApi

log = logging.getLogger("ate_devplugin")

EXIT_RUNTIME = 1
EXIT_CONFIG = 2
RELOAD_SIGNALS = (signal.SIGHUP,)
# Every catchable signal whose default would end the process: each stops it cleanly, so
# no stale socket stays behind. (Faults like SIGSEGV and the uncatchable SIGKILL aside.)
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGPWR,
    signal.SIGXCPU,
    signal.SIGSTKFLT,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ate-devplugin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the configured devices to the kubelet")
    run.add_argument("--config", help="resource config file (default: ate.dev/kvm -> /dev/kvm)")
    run.add_argument("--device-root", help=f"where the host's /dev is visible (default {DEFAULTS['device_root']})")
    run.add_argument("--plugin-dir", help=f"the kubelet's device plugin directory (default {DEFAULTS['plugin_dir']})")
    run.add_argument(
        "--metrics-address", help=f"HOST:PORT for /metrics, /healthz, /readyz (default {DEFAULTS['metrics_address']})"
    )
    run.add_argument("--log-format", help="auto, json or text (default auto: json unless on a terminal)")
    run.add_argument("--log-level", help="debug, info, warning or error (default info)")
    run.add_argument("--cdi-dir", help=f"where CDI specs are written (default {DEFAULTS['cdi_dir']})")
    run.add_argument("--mode", help="device-plugin (default), dra, or both")
    run.add_argument("--node-name", help="this node's name, required with DRA (default: $NODE_NAME)")
    run.add_argument("--registry-dir", help=f"the kubelet's plugin registry (default {DEFAULTS['registry_dir']})")
    run.add_argument("--dra-dir", help=f"the DRA driver's socket directory (default {DEFAULTS['dra_dir']})")
    run.add_argument(
        "--dra-slots", help=f"claims that can share each resource on a node (default {DEFAULTS['dra_slots']})"
    )
    run.add_argument(
        "--pod-resources",
        help="on or off: export which pods hold units, read from the kubelet's PodResources API "
        f"(default {DEFAULTS['pod_resources']})",
    )
    run.add_argument(
        "--pod-resources-socket",
        help="the kubelet's PodResources socket (default: pod-resources/kubelet.sock next to the plugin "
        "directory, /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    run.add_argument(
        "--pod-resources-interval",
        help="seconds between Lists when no event asked for one; 0: events only "
        f"(default {DEFAULTS['pod_resources_interval']})",
    )
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", type=Path)
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"ate-devplugin {__version__}")
        return 0
    if args.command == "check-config":
        try:
            resources = load_resources(args.file)
        except ConfigError as exc:
            print(f"ate-devplugin: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"{args.file}: ok, {len(resources)} resource(s): {', '.join(r.name for r in resources)}")
        return 0
    flags = {k: getattr(args, k) for k in DEFAULTS}
    try:
        settings = resolve(flags, os.environ)
        resources = config.load(settings.config, settings.plugin_dir)
        kube = None
        if settings.dra:
            from ate_devplugin.dra.kube import connect  # device-plugin mode loads no Kubernetes client

            kube = connect()
    except ConfigError as exc:
        print(f"ate-devplugin: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.log_format, settings.log_level)
    # The *_created series double the exposition and tell an operator nothing here.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus-client
    try:
        asyncio.run(serve(settings, resources, kube))
    except (OSError, AgentDiedError) as exc:
        log.error("cannot run: %s", exc)
        return EXIT_RUNTIME
    return 0


async def serve(settings: Settings, resources: tuple[ResourceConfig, ...], kube: KubeApi | None = None) -> None:
    loop = asyncio.get_running_loop()
    # Hold gRPC's asyncio runtime for the whole run: when its last server goes, gRPC shuts
    # its poller down from inside the loop, blocking it while a write to a peer that
    # stopped reading is pending.
    grpc.aio.init_grpc_aio()  # type: ignore[attr-defined]  # missing from grpc-stubs
    metrics = Metrics(revision=os.environ.get("ATE_DEVPLUGIN_REVISION", "unknown"))
    tracing = setup_tracing()
    dra = None
    if kube is not None:
        from ate_devplugin.dra.plugin import DraPlugin
        from ate_devplugin.host import cdi
        from ate_devplugin.observability.metrics import DraMetrics

        dra = DraPlugin(settings, kube, cdi.device_id, DraMetrics(metrics.registry), tracing.tracer)
    daemon = Daemon(settings, resources, metrics, tracing, dra=dra)
    http = HttpServer(
        settings.metrics_host, settings.metrics_port, metrics.registry, loop, daemon.readiness, daemon.liveness
    )
    http.start()
    log.info("listening for metrics and probes", extra={"address": f"{settings.metrics_host}:{http.port}"})
    # A parent may have left these blocked (the mask is inherited); we must hear them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*STOP_SIGNALS, *RELOAD_SIGNALS})
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, daemon.request_stop, sig.name)
    for sig in RELOAD_SIGNALS:
        loop.add_signal_handler(sig, daemon.request_reload)
    try:
        await daemon.run()
    finally:
        http.close()
        _flush(tracing.shutdown, settings.timing.trace_flush_s)
        log.info("stopped")


def _flush(shutdown: Callable[[], None], deadline: float) -> None:
    """Flushes spans, giving up after a deadline so an unreachable collector cannot hold exit."""
    thread = threading.Thread(target=shutdown, name="trace flush", daemon=True)
    thread.start()
    thread.join(deadline)
