"""The command line: ate-devplugin run | check-config FILE | version.

Arguments become Settings here; runtime.py builds and runs the daemon from them.
Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage (one line per
problem, no traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ate_devplugin import __version__, runtime
from ate_devplugin.config import MAX_CONFIG_BYTES, ConfigError, Problem, decode_resources, load_resources, read_bounded
from ate_devplugin.runtime import config_error
from ate_devplugin.settings import (
    DEFAULTS,
    DRA_SHARING,
    LOG_FORMATS,
    LOG_LEVELS,
    MODES,
    flag_of,
    idle_fields,
    mode_of,
    resolve,
)
from ate_devplugin.settings import variable_of as var

STDIN = "-"


@dataclass(frozen=True)
class Option:
    """One option of ``run``: what it means, its value's form, and what the default does
    (when the default's text alone does not say it)."""

    key: str
    metavar: str
    text: str
    default: str = ""


def _choices(values: Iterable[str]) -> str:
    return "{" + ",".join(values) + "}"


GROUPS: dict[str, list[Option]] = {
    "the device plugin": [
        Option("config", "FILE", "the resource config file", "none: ate.dev/kvm -> /dev/kvm"),
        Option("device_root", "DIR", "where the host's /dev is visible"),
        Option("plugin_dir", "DIR", "the kubelet's device plugin directory: kubelet.sock and our sockets"),
        Option("metrics_address", "HOST:PORT", "where /metrics, /healthz and /readyz are served"),
        Option("log_format", _choices(LOG_FORMATS), "log lines as JSON or text", "auto: JSON unless on a terminal"),
        Option("log_level", _choices(LOG_LEVELS), "the least severe level logged"),
        Option("cdi_dir", "DIR", "where the CDI specs are written (allocate: cdi or both, and DRA)"),
        Option("mode", _choices(MODES), "serve the device plugin, the DRA driver, or both"),
        Option(
            "socket_suffix",
            "SUFFIX",
            "a suffix of the device plugin sockets' names, e.g. the pod's UID: two plugin pods can then "
            "serve one node at once (a rolling update, Kubernetes 1.37+)",
            "none",
        ),
    ],
    "DRA (mode dra or both)": [
        Option("node_name", "NAME", "this node's name", "$NODE_NAME (the chart sets it); required with DRA"),
        Option("registry_dir", "DIR", "the kubelet's plugin registry"),
        Option("dra_dir", "DIR", "the DRA driver's socket directory"),
        Option("dra_slots", "N", "single-claim devices per resource on a node, beside the shareable one, 1 to 1024"),
        Option(
            "dra_sharing",
            _choices(DRA_SHARING),
            "capacity: one shareable device per resource where the API server keeps it, plus the slots; "
            "slots: the slots only",
        ),
    ],
    "which pods hold units (PodResources)": [
        Option("pod_resources", "{on,off}", "export which pods hold units, read from the kubelet's PodResources API"),
        Option(
            "pod_resources_socket",
            "PATH",
            "the kubelet's PodResources socket",
            "pod-resources/kubelet.sock next to the plugin directory",
        ),
        Option(
            "pod_resources_interval", "SECONDS", "seconds between Lists when no event asked for one; 0: events only"
        ),
    ],
}


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


def _option_help(option: Option) -> str:
    default = option.default or DEFAULTS[option.key]
    return f"{option.text}\n[env {var(option.key)}; default: {default}]"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command and every option (the chart's extraArgs guard is
    generated from it: tools/gen-chart-args.py)."""
    parser = argparse.ArgumentParser(
        prog="ate-devplugin",
        description="Hands host character devices (/dev/kvm, ...) to pods: a kubelet device plugin and DRA driver.",
        epilog="Each option of run can also be set by its ATE_DEVPLUGIN_* environment variable; a flag wins.\n"
        "Exit codes: 0 done, 1 runtime failure, 2 bad configuration or usage.\n"
        "See 'ate-devplugin run --help' for the options.",
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,check-config,version}")
    run = sub.add_parser(
        "run",
        help="serve the configured devices to the kubelet",
        description="Serve the configured devices to the kubelet until stopped (SIGTERM); "
        "SIGHUP or a changed config file reloads the config.",
        epilog="A flag wins over its environment variable, which wins over the default.\n"
        "A bad value exits 2 with one line per problem; a value that does nothing in this mode is warned about.",
        formatter_class=_Formatter,
    )
    for title, options in GROUPS.items():
        group = run.add_argument_group(title)
        for option in options:
            group.add_argument(flag_of(option.key), dest=option.key, metavar=option.metavar, help=_option_help(option))
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
    check.add_argument(
        "--mode",
        metavar=_choices(MODES),
        help=f"judge the file for this mode (warnings only)\n[env {var('mode')}; default: {DEFAULTS['mode']}]",
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
    flags = {k: getattr(args, k) for k in DEFAULTS}
    try:
        settings = resolve(flags, os.environ)
    except ConfigError as exc:
        return config_error(exc)
    return runtime.run(settings)


def check_config(file: str, mode_flag: str | None) -> int:
    try:
        mode = mode_of(mode_flag, os.environ)
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


def warn(problems: Iterable[Problem]) -> None:
    for problem in problems:
        print(f"ate-devplugin: warning: {problem}", file=sys.stderr)
