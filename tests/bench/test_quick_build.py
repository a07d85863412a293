"""bench/ refuses the demo's kubelet bench: ``tools/build-kubelet-bench.sh --quick`` (what
``make demo`` builds) compiles without the compiler's optimizations, which would make the
kubelet's CPU, which the benches measure, look worse than it is. A Go program built with
the script's quick flags is told apart from one built without them, and ``python -m bench
run`` with such a kubelet bench exits 2 naming it, before anything starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.machine import quick_build
from tests.harness.kubelet import missing_prerequisites
from tests.harness.require import missing, require_tool

REPO = Path(__file__).resolve().parents[2]


def _quick_gcflags() -> str:
    script = (REPO / "tools" / "build-kubelet-bench.sh").read_text()
    match = re.search(r'^quick_gcflags="([^"]+)"$', script, flags=re.MULTILINE)
    assert match, "tools/build-kubelet-bench.sh has no quick_gcflags"
    return match[1]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One empty Go program, built as the script builds without and with --quick."""
    go = require_tool("go", "https://go.dev/doc/install")
    work = tmp_path_factory.mktemp("quick-build")
    (work / "go.mod").write_text("module quickcheck\n\ngo 1.21\n")
    (work / "main.go").write_text("package main\n\nfunc main() {}\n")
    env = {**os.environ, "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    built = {}
    for name, flags in (("optimized", []), ("quick", [f"-gcflags={_quick_gcflags()}"])):
        built[name] = work / name
        subprocess.run(
            [go, "build", "-trimpath", *flags, "-ldflags", "-s -w", "-o", str(built[name]), "."],
            cwd=work, env=env, check=True, capture_output=True, timeout=900,
        )  # fmt: skip
    return built


def test_a_quick_build_is_told_apart(programs: dict[str, Path]) -> None:
    assert quick_build(programs["quick"])
    assert not quick_build(programs["optimized"])


def test_bench_refuses_a_quick_kubelet_bench(programs: dict[str, Path], tmp_path: Path) -> None:
    why = missing_prerequisites()
    if why:
        missing(why)
    benches = tmp_path / "kubelet-bench"
    benches.mkdir()
    shutil.copy2(programs["quick"], benches / "kubelet-bench-1.37")
    results = tmp_path / "results"
    out = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--quick", "--results-dir", str(results)],
        cwd=REPO, env={**os.environ, "KUBELET_BENCH_DIR": str(benches)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "kubelet bench 1.37 is a --quick build" in out.stderr
    assert not results.exists(), "nothing is written before the check"
