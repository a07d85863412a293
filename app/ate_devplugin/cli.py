"""The command line: ``ate-devplugin run | check-config FILE | version``.

Arguments become Settings here; runtime.py builds and runs the daemon from them.
Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage (one line, no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ate_devplugin import __version__, runtime
from ate_devplugin.config import ConfigError, load_resources
from ate_devplugin.runtime import EXIT_CONFIG
from ate_devplugin.settings import DEFAULTS, resolve


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
    run.add_argument(
        "--socket-suffix",
        help="a suffix of the device plugin sockets' names, e.g. the pod's UID: two plugin pods can then "
        "serve one node at once (rolling update, Kubernetes 1.37+; default none)",
    )
    run.add_argument("--mode", help="device-plugin (default), dra, or both")
    run.add_argument("--node-name", help="this node's name, required with DRA (default: $NODE_NAME)")
    run.add_argument("--registry-dir", help=f"the kubelet's plugin registry (default {DEFAULTS['registry_dir']})")
    run.add_argument("--dra-dir", help=f"the DRA driver's socket directory (default {DEFAULTS['dra_dir']})")
    run.add_argument(
        "--dra-slots",
        help=f"single-claim devices per resource on a node, beside the shareable one (default {DEFAULTS['dra_slots']})",
    )
    run.add_argument(
        "--dra-sharing",
        help="capacity: one shareable device per resource where the API server keeps it, plus the slots; "
        f"slots: the slots only (default {DEFAULTS['dra_sharing']})",
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
    except ConfigError as exc:
        print(f"ate-devplugin: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return runtime.run(settings)
