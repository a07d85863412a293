"""The guard on daemon.extraArgs and daemon.extraEnv (templates/_daemonargs.tpl), generated
from the daemon's table of options by tools/gen-chart-args.py: in step with the table, and
refusing what the chart sets or the daemon lacks."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.harness.chart import REPO, Helm, HelmError, daemonsets

GENERATOR = REPO / "tools" / "gen-chart-args.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_chart_args", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_guard_is_up_to_date() -> None:
    out = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_every_option_is_either_set_by_the_chart_or_free(generator: ModuleType) -> None:
    options = set(generator.run_options())
    assert {"--mode", "--config"} <= options  # the table was really read
    assert set(generator.chart_sets()) <= options


def test_what_the_chart_passes_is_what_the_guard_calls_the_charts(
    any_helm: Helm, generator: ModuleType, ci_values: Path
) -> None:
    """Every option the DaemonSet passes (extraArgs aside) is one the guard refuses in extraArgs."""
    for ds in daemonsets(any_helm.template([ci_values])):
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "run"
        passed = {a.split("=", 1)[0] for a in args[1:]}
        sets = set(generator.chart_sets())
        assert passed <= sets, passed - sets


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("daemon: {extraArgs: [--mode=dra]}", '"--mode=dra" is set by the chart: use dra.mode'),
        ("daemon: {extraArgs: [--mode, dra]}", '"--mode" is set by the chart: use dra.mode'),
        ("daemon: {extraArgs: [--dra-slots=8]}", "use dra.slots"),
        ("daemon: {extraArgs: [--node-name=n1]}", "downward API"),
        ("daemon: {extraArgs: [--pod-resources-interval=5]}", "use podResources.interval"),
        ("daemon: {extraArgs: [--mod=dra]}", '"--mod=dra" is not an option of `ate-devplugin run`'),
        ("daemon: {extraArgs: [--verbose]}", '"--verbose" is not an option of `ate-devplugin run`'),
        ("daemon: {extraArgs: [dra]}", '"dra" is not an option'),
        (
            "daemon: {extraEnv: [{name: ATE_DEVPLUGIN_MODE, value: dra}]}",
            "daemon.extraEnv[0]: ATE_DEVPLUGIN_MODE sets --mode, which the chart sets: use dra.mode",
        ),
        ("daemon: {extraEnv: [{name: ATE_DEVPLUGIN_CONFIG, value: /x}]}", "sets --config"),
    ],
)
def test_refused(any_helm: Helm, write_values: Callable[[str], Path], values: str, message: str) -> None:
    with pytest.raises(HelmError) as err:
        any_helm.template([write_values(values)])
    assert message in str(err.value)


def test_other_variables_pass(any_helm: Helm, write_values: Callable[[str], Path]) -> None:
    values = write_values(
        "daemon: {extraEnv: [{name: GRPC_VERBOSITY, value: ERROR}, {name: ATE_DEVPLUGIN_X, value: y}]}"
    )
    (ds,) = daemonsets(any_helm.template([values]))
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"GRPC_VERBOSITY", "ATE_DEVPLUGIN_X"} <= env


def test_a_free_option_would_pass(
    generator: ModuleType, monkeypatch: pytest.MonkeyPatch, helm: Helm, tmp_path: Path
) -> None:
    """Were an option left to extraArgs, the guard would let it through with its value, in
    both spellings, and still refuse a missing value."""
    sets = {k: v for k, v in generator.chart_sets().items() if k != "--dra-slots"}
    monkeypatch.setattr(generator, "chart_sets", lambda: sets)
    chart = tmp_path / "ate-devplugin"
    shutil.copytree(REPO / "chart", chart)
    (chart / "templates" / "_daemonargs.tpl").write_text(generator.template_text())
    for i, args in enumerate((["--dra-slots=8"], ["--dra-slots", "8"])):
        values = tmp_path / f"values-{i}.yaml"  # a name of its own: helm.template caches by arguments
        values.write_text(yaml.safe_dump({"daemon": {"extraArgs": args}}))
        (ds,) = daemonsets(helm.template([values], chart=chart))
        assert ds["spec"]["template"]["spec"]["containers"][0]["args"][-len(args) :] == args
    with pytest.raises(HelmError, match="needs a value"):
        helm.template(sets=["daemon.extraArgs[0]=--dra-slots"], chart=chart)
