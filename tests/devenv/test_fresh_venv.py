"""One dev environment: a fresh venv with only ``pip install -e ".[dev]"`` collects every
test and passes mypy (tests, bench, tools and dashboards import nothing else).

The venv is built once per session in a temporary directory. Where pip's registry cannot
be reached the tests skip (fail under CI, tests/harness/require.py); any other pip
failure fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.require import missing

REPO = Path(__file__).resolve().parents[2]
# What pip says when it cannot reach an index (requests/urllib3 and pip's own words).
UNREACHABLE = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "ConnectTimeoutError",
    "Network is unreachable",
    "ProxyError",
    "No matching distribution found",
)


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("fresh-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", f"{REPO}[dev]"]
    out = subprocess.run(install, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        if any(words in out.stderr for words in UNREACHABLE):
            missing(f"pip's registry is unreachable: {out.stderr.strip().splitlines()[-1]}")
        pytest.fail(f'pip install -e ".[dev]" failed:\n{out.stderr[-4000:]}', pytrace=False)
    return python


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "COVERAGE"))}
    return subprocess.run(
        [str(python), *args], cwd=REPO, capture_output=True, text=True, timeout=1800, check=False, env=env
    )


def test_every_test_is_collected(fresh_python: Path) -> None:
    out = run(fresh_python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " error" not in out.stdout.splitlines()[-1], out.stdout[-4000:]
    assert "tests/unit/dra/test_kube.py::" in out.stdout  # the DRA client is in


def test_mypy_passes(fresh_python: Path) -> None:
    out = run(fresh_python, "-m", "mypy")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
