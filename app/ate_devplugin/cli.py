"""The command line: ate-devplugin run | check-config FILE | probe | verify | version.

Arguments become Settings here; runtime.py builds and runs the daemon from them, and is
imported only by ``run``: the other commands load neither gRPC nor the metrics.
Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage (one line per
problem, no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

from ate_devplugin import __version__
from ate_devplugin.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    Problem,
    config_error,
    decode_resources,
    load_resources,
    read_bounded,
)
from ate_devplugin.kvm import verify as kvm_verify
from ate_devplugin.kvm.facts import read_node_facts
from ate_devplugin.settings import GROUPS, OPTIONS, Option, idle_fields, resolve, value_of

STDIN = "-"
MAX_VERIFY_TIMEOUT_S = 300.0


class _Formatter(argparse.HelpFormatter):
    """Keeps the line breaks of descriptions and help texts (an option's last line names
    its variable and default), wrapping each line on its own, never inside a path."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [
            part
            for line in text.splitlines()
            for part in textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False) or [""]
        ]

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in self._split_lines(text, width - len(indent)))


def _option_help(option: Option[object], text: str = "") -> str:
    return f"{text or option.help}\n[env {option.variable}; default: {option.shown_default}]"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; the options of run come from the settings' table."""
    parser = argparse.ArgumentParser(
        prog="ate-devplugin",
        description="Hands host character devices (/dev/kvm, ...) to pods: a kubelet device plugin and DRA driver.",
        epilog="Each option of run can also be set by its ATE_DEVPLUGIN_* environment variable; a flag wins.\n"
        "Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage.\n"
        "See 'ate-devplugin run --help' for the options.",
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,check-config,probe,verify,version}")
    run = sub.add_parser(
        "run",
        help="serve the configured devices to the kubelet",
        description="Serve the configured devices to the kubelet until stopped (SIGTERM); "
        "SIGHUP or a changed config file reloads the config.",
        epilog="A flag wins over its environment variable, which wins over the default.\n"
        "A bad value exits 2 with one line per problem; a value that does nothing in this mode is warned about.",
        formatter_class=_Formatter,
    )
    for g in GROUPS:
        group = run.add_argument_group(g.title)
        for option in g.options:
            group.add_argument(option.flag, dest=option.key, metavar=option.metavar, help=_option_help(option))
    check = sub.add_parser(
        "check-config",
        help="validate a config file and exit",
        description="Validate a config file: every problem is printed on its own line, naming its field, "
        "and the exit code is 2; fields that do nothing in the mode are warned about (exit 0).",
        formatter_class=_Formatter,
    )
    check.add_argument(
        "file", metavar="FILE", help=f"the config file, or - for stdin (at most {MAX_CONFIG_BYTES} bytes either way)"
    )
    mode = OPTIONS["mode"]
    check.add_argument(
        mode.flag, metavar=mode.metavar, help=_option_help(mode, "judge the file for this mode (warnings only)")
    )
    probe = sub.add_parser(
        "probe",
        help="the KVM prober: probe the devices granted to this container for the daemon",
        description="Connect to the daemon's prober socket (--kvm-probe socket) and answer its probe requests "
        "with functional KVM probes of the devices given; reconnect with backoff; exit 0 when the daemon says "
        "the device is stale (docs/kvm-health.md).",
        formatter_class=_Formatter,
    )
    socket_option = OPTIONS["kvm_probe_socket"]
    probe.add_argument(
        socket_option.flag, metavar=socket_option.metavar, default=socket_option.default, help="the daemon's socket"
    )
    probe.add_argument(
        "--device",
        action="append",
        metavar="RESOURCE=PATH",
        default=[],
        help="a resource and its device in this container (repeatable); default ate.dev/kvm=/dev/kvm",
    )
    verify = sub.add_parser(
        "verify",
        help="run a VM on a KVM device and say what it saw",
        description="Open the KVM device, make a VM and a vCPU, run a few guest instructions to their "
        "expected exits (in a child process, within --timeout), and print what was seen: the device, the KVM "
        "API version, the guest's exits, the node's KVM and CPU. The last line is PASS or FAIL <reason>: "
        "<message>. Exit 0 when the guest ran as expected, 1 when it did not, 2 on bad usage. "
        "The chart's `helm test` pod runs it on the device its pod was granted.",
        formatter_class=_Formatter,
    )
    verify.add_argument("--device", default="/dev/kvm", help="the KVM device to open [default: /dev/kvm]")
    verify.add_argument(
        "--timeout",
        default=str(kvm_verify.DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"give up on the VM after this long (0 < SECONDS <= {MAX_VERIFY_TIMEOUT_S:g}) "
        f"[default: {kvm_verify.DEFAULT_TIMEOUT_S:g}]",
    )
    verify.add_argument(
        "--json", action="store_true", help="print one JSON object (result, node) instead of the report"
    )
    sub.add_parser("version", help="print the version", description="Print the version.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"ate-devplugin {__version__}")
        return 0
    if args.command == "check-config":
        return check_config(args.file, args.mode)
    if args.command == "probe":
        from ate_devplugin.kvm import prober

        try:
            devices = prober.parse_devices(args.device or ["ate.dev/kvm=/dev/kvm"])
        except ValueError as exc:
            print(f"ate-devplugin: {exc}", file=sys.stderr)
            return 2
        return prober.run(args.kvm_probe_socket, devices)
    if args.command == "verify":
        return verify(args.device, args.timeout, args.json)
    flags = {key: getattr(args, key) for key in OPTIONS}
    try:
        settings = resolve(flags, os.environ)
    except ConfigError as exc:
        return config_error(exc)
    from ate_devplugin import runtime  # grpc, prometheus-client, opentelemetry: only the daemon loads them

    return runtime.run(settings)


def check_config(file: str, mode_flag: str | None) -> int:
    try:
        mode = value_of("mode", mode_flag, os.environ)
        if file == STDIN:
            resources = decode_resources(read_bounded(sys.stdin.fileno(), "stdin"), "stdin")
        else:
            resources = load_resources(Path(file))
    except ConfigError as exc:
        return config_error(exc)
    warn(idle_fields(resources, mode))
    source = "stdin" if file == STDIN else file
    print(f"{source}: ok, {len(resources)} resource(s): {', '.join(r.name for r in resources)}")
    return 0


def verify(device: str, timeout_text: str, as_json: bool) -> int:
    try:
        timeout = float(timeout_text)
    except ValueError:
        timeout = math.nan
    if not 0 < timeout <= MAX_VERIFY_TIMEOUT_S:  # NaN and inf fail here too
        print(
            f"ate-devplugin: verify --timeout: {timeout_text!r} is not a number of seconds "
            f"above 0 and at most {MAX_VERIFY_TIMEOUT_S:g}",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(kvm_verify.verify(read_node_facts(), sys.stdout, device, timeout, as_json))


def warn(problems: Iterable[Problem]) -> None:
    for problem in problems:
        print(f"ate-devplugin: warning: {problem}", file=sys.stderr)
