"""The command line: ate-devplugin run | check-config FILE | probe | verify | cpu-profile |
restore-profile | restorable | version.

Arguments become Settings here; runtime.py builds and runs the daemon from them, and is
imported only by ``run``: the other commands load neither gRPC nor the metrics.
Exit codes: 0 done, 1 runtime failure, 2 bad configuration, input file or usage (one
line per problem, no traceback); restorable says 1 for "not restorable" and 3 when the
probe failed.
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
from typing import TYPE_CHECKING

from ate_devplugin import __version__
from ate_devplugin.config import (
    EXIT_CONFIG,
    MAX_CONFIG_BYTES,
    MAX_JSON_DEPTH,
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

if TYPE_CHECKING:
    from ate_devplugin.cpu.profile import CpuProfile

STDIN = "-"
MAX_VERIFY_TIMEOUT_S = 300.0
# restorable's answers: all restorable, one is not, bad input (EXIT_CONFIG), no probe.
EXIT_RESTORABLE, EXIT_NOT_RESTORABLE, EXIT_NOT_PROBED = 0, 1, 3
_JSON_INPUT = f"at most {MAX_CONFIG_BYTES} bytes and {MAX_JSON_DEPTH} levels deep"


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
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{run,check-config,probe,verify,cpu-profile,restore-profile,restorable,version}",
    )
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
    _device_options(verify, "open", "the VM")
    verify.add_argument(
        "--json", action="store_true", help="print one JSON object (result, node) instead of the report"
    )
    _add_restore_commands(sub)
    sub.add_parser("version", help="print the version", description="Print the version.")
    return parser


def _add_restore_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands of snapshot-compatible placement (docs/restore-placement.md)."""
    from ate_devplugin.cpu.restore import DEFAULT_TOLERANCE_PPM

    cpu = sub.add_parser(
        "cpu-profile",
        help="print this node's guest CPU profile (JSON), to record next to a snapshot",
        description="Probe the KVM device as verify does (a child process, within --timeout) and print the CPU a "
        "VM can be given here as JSON: KVM's supported CPUID features by name, vendor, family/model, the TSC "
        "frequency of a new vCPU, whether it is invariant and whether KVM can scale it, the KVM implementation. "
        "restore-profile and restorable read it back. Exit 0 printed, 1 when the probe fails, 2 on bad usage.",
        formatter_class=_Formatter,
    )
    _device_options(cpu)
    build = sub.add_parser(
        "restore-profile",
        help="make a restore profile of recorded CPU profiles (YAML for the config)",
        description="Print a restore profile for the config file's restore_profiles: of one recorded profile "
        "(what that snapshot's host offered), or of several (the pool's baseline: the features all offer, their "
        "vendor and KVM implementations, a TSC rule all pass), narrowed by a Firecracker CPU template if given. "
        "Recorded nodes the profile does not serve, and a profile no node can match, are warned about on stderr. "
        "Exit 0 printed; 2, one line naming the file and the field, on a bad input file (missing, too large, not "
        "JSON, too deep, a wrong field) or when there is no such profile.",
        formatter_class=_Formatter,
    )
    build.add_argument(
        "profiles", nargs="+", metavar="PROFILE.json", help=f"profiles printed by cpu-profile ({_JSON_INPUT})"
    )
    build.add_argument("--name", required=True, help="the profile's name (a-z, 0-9 and _)")
    build.add_argument(
        "--cpu-template", metavar="FILE", help=f"a Firecracker custom CPU template (JSON, x86; {_JSON_INPUT})"
    )
    build.add_argument("--no-tsc", action="store_true", help="leave the TSC rule out")
    build.add_argument(
        "--tolerance-ppm",
        type=int,
        default=DEFAULT_TOLERANCE_PPM,
        metavar="PPM",
        help=f"the TSC rule's tolerance [default: {DEFAULT_TOLERANCE_PPM}]",
    )
    check = sub.add_parser(
        "restorable",
        help="say whether this node (or a recorded one) can restore each configured profile, and why not",
        description="Judge every restore profile of the config file against a recorded CPU profile (--profile) or "
        "this node's (a probe of --device), one line each; profiles no node can match are warned about on stderr. "
        f"Exit {EXIT_RESTORABLE} when every one is restorable, {EXIT_NOT_RESTORABLE} when one is not, "
        f"{EXIT_CONFIG} on a bad config, profile file or usage (one line naming the file and what is wrong), "
        f"{EXIT_NOT_PROBED} when the probe of --device failed (nothing was judged).",
        formatter_class=_Formatter,
    )
    check.add_argument("--config", required=True, metavar="FILE", help="the config file")
    check.add_argument(
        "--profile", metavar="PROFILE.json", help=f"a recorded profile instead of a probe ({_JSON_INPUT})"
    )
    _device_options(check)


def _device_options(parser: argparse.ArgumentParser, verb: str = "probe", what: str = "the probe") -> None:
    """--device and --timeout, of the commands that probe a device."""
    parser.add_argument("--device", default="/dev/kvm", help=f"the KVM device to {verb} [default: /dev/kvm]")
    parser.add_argument(
        "--timeout",
        default=str(kvm_verify.DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"give up on {what} after this long (0 < SECONDS <= {MAX_VERIFY_TIMEOUT_S:g}) "
        f"[default: {kvm_verify.DEFAULT_TIMEOUT_S:g}]",
    )


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
    if args.command == "cpu-profile":
        return cpu_profile(args.device, args.timeout)
    if args.command == "restore-profile":
        return restore_profile(args.name, args.profiles, args.cpu_template, not args.no_tsc, args.tolerance_ppm)
    if args.command == "restorable":
        return restorable(args.config, args.profile, args.device, args.timeout)
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
    timeout = _seconds("verify", timeout_text)
    if timeout is None:
        return 2
    return asyncio.run(kvm_verify.verify(read_node_facts(), sys.stdout, device, timeout, as_json))


def _seconds(command: str, timeout_text: str) -> float | None:
    """--timeout's seconds; None (said on stderr) unless above 0 and at most the cap."""
    try:
        timeout = float(timeout_text)
    except ValueError:
        timeout = math.nan
    if not 0 < timeout <= MAX_VERIFY_TIMEOUT_S:  # NaN and inf fail here too
        print(
            f"ate-devplugin: {command} --timeout: {timeout_text!r} is not a number of seconds "
            f"above 0 and at most {MAX_VERIFY_TIMEOUT_S:g}",
            file=sys.stderr,
        )
        return None
    return timeout


# --- snapshot-compatible placement (docs/restore-placement.md) --------------------------


def cpu_profile(device: str, timeout_text: str) -> int:
    import json

    probed = _probed_profile("cpu-profile", device, timeout_text)
    if isinstance(probed, int):
        return probed
    print(json.dumps(probed.to_json(), indent=2))
    return 0


def _probed_profile(command: str, device: str, timeout_text: str, failed: int = 1) -> CpuProfile | int:
    """This node's CPU profile, of a probe of ``device``; else the exit code (said on stderr):
    2 for a bad --timeout, ``failed`` when the probe fails."""
    from ate_devplugin.kvm.facts import cpu_profile as make_profile
    from ate_devplugin.kvm.runner import probe_once

    timeout = _seconds(command, timeout_text)
    if timeout is None:
        return 2
    result = asyncio.run(probe_once(device, timeout))
    if not result.passed or result.device_facts is None:
        print(f"ate-devplugin: {command}: FAIL {result.reason}: {result.message}", file=sys.stderr)
        return failed
    return make_profile(read_node_facts(), result.device_facts)


def _recorded(path: str) -> CpuProfile:
    """A profile printed by cpu-profile; raises ConfigError naming the file and the field."""
    from ate_devplugin.config import read_json
    from ate_devplugin.cpu.profile import CpuProfile, ProfileError

    try:
        return CpuProfile.from_json(read_json(path))
    except ProfileError as exc:
        raise ConfigError(f"{path}: {exc.field}" if exc.field else path, exc.problem) from None


def restore_profile(name: str, paths: Sequence[str], template_path: str | None, tsc: bool, tolerance_ppm: int) -> int:
    import yaml

    from ate_devplugin.config import (
        CPU_TEMPLATE,
        RESTORE_PREFIX,
        profile_entry,
        read_json,
        restore_profile_warnings,
        template_effect,
    )
    from ate_devplugin.config.schema import RESTORE_PROFILES
    from ate_devplugin.cpu.restore import PPM, BaselineError, baseline
    from ate_devplugin.cpu.restore import restorable as judge

    try:
        RESTORE_PROFILES.key.check(name, "--name")
        if not 0 <= tolerance_ppm <= PPM:
            raise ConfigError("--tolerance-ppm", f"must be from 0 to {PPM} (got {tolerance_ppm})")
        recorded = [(path, _recorded(path)) for path in paths]
        effect = None
        if template_path is not None:
            effect = template_effect(CPU_TEMPLATE.check(read_json(template_path), template_path))
        try:
            profile = baseline(name, recorded, effect, tsc, tolerance_ppm)
        except BaselineError as exc:
            raise ConfigError("restore-profile", str(exc)) from None
        entry = {name: profile_entry(profile)}
        RESTORE_PROFILES.check(entry, "restore_profiles")  # what is printed loads as it is
    except ConfigError as exc:
        return config_error(exc)
    for path, node in recorded:
        if not (answer := judge(profile, node)).restorable:
            print(f"ate-devplugin: warning: {path}: {answer}", file=sys.stderr)
    warn(restore_profile_warnings(profile, name))
    said = f"the baseline of {len(paths)} recorded profiles" if len(paths) > 1 else "1 recorded profile"
    head = [f"# {RESTORE_PREFIX}{name}: built by ate-devplugin restore-profile of {said}"]
    if effect is not None:
        left_out = f" (not features, left out: {', '.join(effect.ignored)})" if effect.ignored else ""
        head.append(f"# narrowed by {template_path}{left_out}")
    print("\n".join([*head, "# Paste it under a KVM resource's restore_profiles."]))
    print(yaml.safe_dump(entry, sort_keys=False, default_flow_style=False), end="")
    return 0


def restorable(config_path: str, profile_path: str | None, device: str, timeout_text: str) -> int:
    from ate_devplugin.config import profile_warnings
    from ate_devplugin.cpu.restore import restorable as judge

    try:
        resources = load_resources(Path(config_path))
        node = _recorded(profile_path) if profile_path else None
    except ConfigError as exc:
        return config_error(exc)
    warn(profile_warnings(resources))
    judged = [(r.name, p) for r in resources for p in r.restore_profiles]
    if not judged:
        print(f"{config_path}: no restore profiles")
        return EXIT_RESTORABLE
    if node is None:
        probed = _probed_profile("restorable", device, timeout_text, EXIT_NOT_PROBED)
        if isinstance(probed, int):
            return probed
        node = probed
    answers = [(resource, judge(p, node)) for resource, p in judged]
    for resource, answer in answers:
        print(f"{resource} {answer}")
    return EXIT_RESTORABLE if all(a.restorable for _, a in answers) else EXIT_NOT_RESTORABLE


def warn(problems: Iterable[Problem]) -> None:
    for problem in problems:
        print(f"ate-devplugin: warning: {problem}", file=sys.stderr)
