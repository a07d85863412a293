"""The command line as an operator meets it: exit codes, a line per problem naming the
field, flag or variable, warnings, stdin, and --help."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from ate_devplugin import __version__
from ate_devplugin.cli import build_parser, main
from ate_devplugin.settings import GROUPS, OPTIONS

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, stdin: str | IO[bytes] | None = None) -> Result:
    """``python -m ate_devplugin ARGS``; ``stdin`` is text to write or a file to read from."""
    proc = subprocess.run(
        [sys.executable, "-m", "ate_devplugin", *args],
        input=stdin.encode() if isinstance(stdin, str) else None,
        stdin=subprocess.DEVNULL if stdin is None else None if isinstance(stdin, str) else stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def test_version() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"ate-devplugin {__version__}"


def test_check_config_ok(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n")
    result = run("check-config", str(config))
    assert result.returncode == 0, result.stderr
    assert "ate.dev/kvm" in result.stdout


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_bad_config_exits_2_with_one_line_for_its_one_problem(tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: -1}]\n")
    plugin_dir = tmp_path / "plugins"
    args = [str(config)] if command == "check-config" else ["--config", str(config), "--plugin-dir", str(plugin_dir)]
    result = run(command, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("ate-devplugin: config error: resources[0].units:")
    assert not plugin_dir.exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "env", "field"),
    [
        (["--device-root", "dev"], {}, "--device-root"),
        (["--metrics-address", "localhost"], {}, "--metrics-address"),
        ([], {"ATE_DEVPLUGIN_LOG_FORMAT": "xml"}, "ATE_DEVPLUGIN_LOG_FORMAT"),
        (["--plugin-dir", "/" + "p" * 100], {}, "resources[0].name"),
        (["--cdi-dir", "run/cdi"], {}, "--cdi-dir"),
        ([], {"ATE_DEVPLUGIN_CDI_DIR": "cdi"}, "ATE_DEVPLUGIN_CDI_DIR"),
        (["--pod-resources", "yes"], {}, "--pod-resources"),
        (["--pod-resources-socket", "kubelet.sock"], {}, "--pod-resources-socket"),
        ([], {"ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL": "-1"}, "ATE_DEVPLUGIN_POD_RESOURCES_INTERVAL"),
        (["--pod-resources-interval", "nan"], {}, "--pod-resources-interval"),
        (["--pod-resources-interval", "soon"], {}, "--pod-resources-interval"),
        ([], {"ATE_DEVPLUGIN_MODE": "dra-only"}, "ATE_DEVPLUGIN_MODE"),
    ],
)
def test_bad_settings_exit_2_naming_the_flag_or_variable(args: list[str], env: dict[str, str], field: str) -> None:
    result = run("run", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"ate-devplugin: config error: {field}:"), result.stderr


def test_every_bad_setting_gets_its_line(tmp_path: Path) -> None:
    result = run("run", "--mode", "dra", "--dra-slots", "0", env={"ATE_DEVPLUGIN_LOG_LEVEL": "loud", "NODE_NAME": ""})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "ate-devplugin: config error: ATE_DEVPLUGIN_LOG_LEVEL: must be one of debug, info, warning, error (got 'loud')",
        "ate-devplugin: config error: --node-name: is required in mode dra: set NODE_NAME (downward API), "
        "ATE_DEVPLUGIN_NODE_NAME or --node-name",
        "ate-devplugin: config error: --dra-slots: must be an integer from 1 to 1024 (got '0')",
    ]


# --- a file with several mistakes: every one on its line, with a hint ------------------

MISTAKES = REPO / "docs" / "examples" / "config-mistakes.yaml"
MISTAKES_OUTPUT = """\
ate-devplugin: config error: resources[0].device: unknown key (hint: did you mean 'devices'?)
ate-devplugin: config error: resources[0].units: must be a positive integer (got '64') (hint: write it without quotes: 64)
ate-devplugin: config error: resources[0].allocate: must be one of devices, cdi, both (got 'CDI') (hint: did you mean 'cdi'?)
ate-devplugin: config error: resources[0].cdi.file_mode: must be a string (got 438) (hint: YAML reads an unquoted 0666 as the octal number 438: write '0666', in quotes)
ate-devplugin: config error: resources[0].devices: is required
ate-devplugin: config error: resources[1].file_mode: unknown key (hint: file_mode goes under cdi)
ate-devplugin: config error: resources[1].env.VHOST: must be a string or a number (got True) (hint: YAML reads an unquoted yes, no, on, off, true or false as a boolean: write it in quotes)
ate-devplugin: config error: resources[1].mounts: must be a list (hint: start each entry with '- ')
"""  # noqa: E501


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_file_of_mistakes_gets_a_line_for_each_with_hints(tmp_path: Path, command: str) -> None:
    plugin_dir = tmp_path / "plugins"
    args = (
        [str(MISTAKES)] if command == "check-config" else ["--config", str(MISTAKES), "--plugin-dir", str(plugin_dir)]
    )
    result = run(command, *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == MISTAKES_OUTPUT
    assert not plugin_dir.exists()  # nothing started


def test_check_config_reads_stdin() -> None:
    good = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm]}]\n"
    result = run("check-config", "-", stdin=good)
    assert (result.returncode, result.stdout, result.stderr) == (0, "stdin: ok, 1 resource(s): ate.dev/kvm\n", "")
    result = run("check-config", "-", stdin=MISTAKES.read_text())
    assert (result.returncode, result.stderr) == (2, MISTAKES_OUTPUT)


def test_check_config_reads_stdin_within_the_bound() -> None:
    """Endless bytes on stdin: refused after 1 MiB, not read forever."""
    with open("/dev/zero", "rb") as zero:
        result = run("check-config", "-", stdin=zero)
    assert result.returncode == 2
    assert result.stderr == (
        "ate-devplugin: config error: stdin: is larger than 1048576 bytes (a ConfigMap holds at most 1 MiB)\n"
    )


def test_check_config_warns_about_fields_that_do_nothing_in_the_mode(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "resources:\n"
        "  - {name: ate.dev/kvm, devices: [/dev/kvm], cdi: {file_mode: '0666'}}\n"
        "  - {name: ate.dev/tun, devices: [/dev/net/tun], preferred_allocation: true}\n"
    )
    result = run("check-config", str(config))
    assert (result.returncode, result.stdout) == (0, f"{config}: ok, 2 resource(s): ate.dev/kvm, ate.dev/tun\n")
    assert result.stderr == (
        "ate-devplugin: warning: resources[0].cdi: does nothing with allocate: devices in mode device-plugin: "
        "no CDI spec is written (hint: set allocate: cdi or both to answer with the CDI device)\n"
    )
    dra = run("check-config", str(config), env={"ATE_DEVPLUGIN_MODE": "dra"})
    assert (dra.returncode, dra.stderr) == (
        0,
        "ate-devplugin: warning: resources[1].preferred_allocation: does nothing in mode dra: "
        "only the device plugin answers GetPreferredAllocation\n",
    )
    assert run("check-config", str(config), "--mode", "both").stderr == ""
    bad_mode = run("check-config", str(config), "--mode", "kubelet")
    assert (bad_mode.returncode, bad_mode.stderr) == (
        2,
        "ate-devplugin: config error: --mode: must be one of device-plugin, dra, both (got 'kubelet')\n",
    )


# --- --help: plain text, every variable, choice and default ----------------------------


def _help(*command: str) -> str:
    result = run(*command, "--help", env={"COLUMNS": "100"})
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout


def test_run_help_names_every_flag_with_its_variable_choices_and_default() -> None:
    text = _help("run")
    flat = " ".join(text.split())  # help lines wrap anywhere
    for group in GROUPS:
        assert f"{group.title}:" in flat
        for option in group.options:
            flag = "--" + option.key.replace("_", "-")
            default = option.default_help or option.default
            assert (
                f"{flag} {option.metavar} {option.help} [env ATE_DEVPLUGIN_{option.key.upper()}; default: {default}]"
                in flat
            ), flag
    for choices in ("--mode {device-plugin,dra,both}", "--log-format {auto,json,text}", "--pod-resources {on,off}"):
        assert choices in flat
    assert "--log-level {debug,info,warning,error}" in flat


def test_the_options_of_run_are_the_table_of_options() -> None:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    run_options = {a.dest: a for a in commands.choices["run"]._actions if a.dest != "help"}
    assert list(run_options) == list(OPTIONS)
    for key, action in run_options.items():
        assert (action.option_strings, action.metavar) == ([OPTIONS[key].flag], OPTIONS[key].metavar)


@pytest.mark.parametrize(
    "command",
    [(), ("run",), ("check-config",), ("probe",), ("verify",), ("cpu-profile",), ("restore-profile",),
     ("restorable",), ("version",)],
)  # fmt: skip
def test_help_is_plain_text(command: tuple[str, ...]) -> None:
    text = _help(*command)
    for markup in ("``", ":class:", ":func:", ".. ", "**"):
        assert markup not in text, f"{command}: {markup!r} in\n{text}"
    assert max(len(line) for line in text.splitlines()) <= 100


def test_top_level_and_check_config_help() -> None:
    top = " ".join(_help().split())
    assert "{run,check-config,probe,verify,cpu-profile,restore-profile,restorable,version}" in top
    assert "ATE_DEVPLUGIN_* environment variable" in top
    assert "2 bad configuration or usage" in top
    check = " ".join(_help("check-config").split())
    assert "FILE the config file, or - for stdin (at most 1048576 bytes either way)" in check
    assert "--mode {device-plugin,dra,both} judge the file for this mode (warnings only)" in check
    assert "[env ATE_DEVPLUGIN_MODE; default: device-plugin]" in check


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ("allocate: cdi-only", "resources[0].allocate"),
        ("cdi: {file_mode: 438}", "resources[0].cdi.file_mode"),
        ("cdi: {file_mode: '0999'}", "resources[0].cdi.file_mode"),
        ("cdi: {uid: -1}", "resources[0].cdi.uid"),
        ("cdi: {gid: 4294967296}", "resources[0].cdi.gid"),
        ("cdi: {mode: '0666'}", "resources[0].cdi.mode"),
    ],
)
def test_bad_cdi_settings_exit_2_naming_the_field(tmp_path: Path, resource: str, field: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], {resource}}}]\n")
    result = run("run", "--config", str(config), "--plugin-dir", str(tmp_path / "plugins"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"ate-devplugin: config error: {field}:"), result.stderr


def test_probe_refuses_a_device_without_its_resource(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--device", "/dev/kvm"]) == 2
    assert capsys.readouterr().err == "ate-devplugin: --device '/dev/kvm': give RESOURCE=/absolute/path\n"


# --- verify: the command's own part (tests/kvm runs it on the machine's real /dev/kvm) -----


def test_verify_on_a_device_that_is_not_kvm_fails_with_its_reason_last() -> None:
    result = run("verify", "--device", "/dev/null", "--timeout", "5")
    assert result.returncode == 1, result
    report = result.stdout.splitlines()
    assert report[0] == "ate-devplugin verify /dev/null"
    assert "  device:          character device 1:3, crw-rw-rw- (0666) owner 0:0 here" in report
    assert report[-1].startswith("FAIL not-a-kvm-device: /dev/null: character device 1:3 does not answer"), report
    assert result.stderr == ""


def test_verify_json_is_one_object_for_scripts(tmp_path: Path) -> None:
    missing = tmp_path / "kvm"
    result = run("verify", "--device", str(missing), "--json")
    assert result.returncode == 1, result
    (line,) = result.stdout.splitlines()
    found = json.loads(line)
    assert (found["result"]["reason"], found["result"]["passed"]) == ("missing", False)
    assert found["result"]["message"] == f"{missing}: no such device node"
    assert set(found["node"]) >= {"architecture", "kvm_implementation", "kernel_release"}
    assert found["access"]["device_node"] is None  # nothing to stat
    assert found["access"]["process"]["uid"] == os.geteuid()


@pytest.mark.parametrize("timeout", ["0", "-1", "x", "nan", "inf", "301"])
def test_verify_with_a_bad_timeout_exits_2_with_one_line(timeout: str) -> None:
    result = run("verify", "--device", "/dev/null", "--timeout", timeout)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"ate-devplugin: verify --timeout: {timeout!r} is not a number of seconds above 0 and at most 300\n"
    )


def test_verify_help_says_what_it_does_and_its_exit_codes() -> None:
    text = " ".join(_help("verify").split())
    assert "Exit 0 when the guest ran as expected, 1 when it did not, 2 on bad usage." in text
    assert "--device DEVICE the KVM device to open [default: /dev/kvm]" in text
    assert "--timeout SECONDS" in text
