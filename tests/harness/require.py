"""What a test needs from the machine: skipped locally when missing, a failure in CI.

One switch: ``CI`` (``.ci/run`` sets ``CI=true``; so do the usual CI services). There a
missing tool, bench or privilege is a broken CI machine, not a reason to skip.

One exception, :func:`not_this_kind_of_machine`: a test about a kind of machine that this
one is not (hardware KVM, where KVM here is software) is skipped under CI too, saying so
in the run's output. It is for facts of the hardware no setup can change, never for a
missing tool, and never for a test that is the only proof of something.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from tests.harness.kubelet import built_versions, missing_prerequisites


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(why: str) -> NoReturn:
    """Skips the test, or fails it under CI."""
    if in_ci():
        pytest.fail(f"{why} (required under CI)", pytrace=False)
    pytest.skip(why)


def missing_tool(what: str, install: str) -> NoReturn:
    missing(f"{what} not found; install with: {install}")


def not_this_kind_of_machine(why: str, terminal: pytest.CaptureFixture[str]) -> NoReturn:
    """Skips the test, under CI too, with ``why`` printed to the terminal (past pytest's
    output capture) and given as the skip's reason."""
    with terminal.disabled():
        print(f"\nNOT RUN (this kind of machine): {why}")
    pytest.skip(f"not this kind of machine: {why}")


def require(ok: object, why: str) -> None:
    """Goes on when ``ok`` is truthy; otherwise :func:`missing` with ``why``."""
    if not ok:
        missing(why)


def require_tool(name: str, install: str) -> str:
    """The path of the program ``name`` on PATH; ``install`` says how to get it."""
    path = shutil.which(name)
    if path is None:
        missing_tool(name, install)
    return path


def require_kubelet_bench(version: str | None = None) -> None:
    """The kubelet bench can run here (root, util-linux) and ``version`` (or any release) is built."""
    why = missing_prerequisites()
    if why:
        missing(why)
    built = built_versions()
    require(
        version in built if version else built,
        f"kubelet bench {version or ''} not built: run tools/build-kubelet-bench.sh",
    )
