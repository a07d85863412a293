"""Setup builds each tool once: run again after the setup `make test` begins with, every
build that tools/setup.sh runs finds its output up to date and compiles nothing.

A build that no longer sees its own output (a flag or path changed on one side only) would
rebuild for minutes on every CI run and go unnoticed in a green log: this fails instead.
The builds are run as setup runs them, without its apt and pip steps (a reinstall of the
package beside the e2e session, which runs at the same time, could fail a start there).
Runs where setup has run (CI, or a machine with the kubelet bench built); elsewhere it skips.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.harness.require import in_ci

REPO = Path(__file__).resolve().parents[2]
# Each build script's words for an output it keeps, and how many outputs say so.
UP_TO_DATE = {
    "build-kubelet-bench.sh": 3,  # 1.29, 1.35, 1.37
    "build-helm.sh": 2,  # v3, v4
    "build-kube-state-metrics.sh": 1,
    "build-k8s.sh": 2,  # 1.35, 1.37
    "build-containerd.sh": 1,
    "build-nfd.sh": 1,
}
# What tools/setup.sh test runs to build (install-test-tools.sh: checkov, helm, kube-state-metrics).
BUILDS = (
    ["tools/build-kubelet-bench.sh"],
    ["tools/install-test-tools.sh", "--no-apt"],
    ["tools/build-k8s.sh", "1.35"],
    ["tools/build-k8s.sh", "1.37"],
    ["tools/build-containerd.sh"],
    ["tools/build-nfd.sh"],
)
AGAIN = re.compile(r": building |^Collecting |^Successfully installed")


def test_the_builds_are_setups() -> None:
    """The list above is what setup runs, so the check below checks setup."""
    setup = (REPO / "tools/setup.sh").read_text()
    assert [b for b in BUILDS if " ".join(b) not in setup] == []


def test_a_second_setup_builds_nothing() -> None:
    if not in_ci() and not (REPO / "build/kubelet-bench/kubelet-bench-1.37").exists():
        pytest.skip("setup has not run here (tools/setup.sh test): a first run would build everything")
    out = ""
    for build in BUILDS:
        run = subprocess.run(build, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
        out += run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
    assert [line for line in out.splitlines() if AGAIN.search(line)] == []
    kept = {script: len(re.findall(rf"^{re.escape(script)}: .* up to date", out, re.M)) for script in UP_TO_DATE}
    assert kept == UP_TO_DATE, out[-3000:]
