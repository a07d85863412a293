"""Builds the suite starts at collection, beside the tests that need no build.

The arm64 image takes minutes of emulation on one core while the chart, docs and alert
tests before it keep the other busy: started when the session has collected its tests, it
is ready (or nearly) when tests/image asks for it. A build that was not started early (the
module run alone with -k, a machine without the tools) runs when asked, as before.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Build:
    proc: subprocess.Popen[str]
    output: Path
    started: float

    def result(self, timeout: float) -> tuple[int, str, float]:
        """Its exit code, its output and its seconds from start, once it ends."""
        try:
            code = self.proc.wait(timeout=max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, self.output.read_text(errors="replace"), time.monotonic() - self.started


_started: dict[str, Build] = {}


def start(name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Starts ``argv`` now (nice 10: the tests running meanwhile come first)."""
    _started[name] = _spawn(name, argv, env)


def _spawn(name: str, argv: Sequence[str], env: Mapping[str, str]) -> Build:
    out = Path(tempfile.mkstemp(prefix=f"early-{name}-", suffix=".log")[1])
    with out.open("w") as sink:
        proc = subprocess.Popen(["nice", "-n", "10", *argv], stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env})  # fmt: skip
    return Build(proc, out, time.monotonic())


def run(name: str, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, float]:
    """The build's exit code, output and seconds: the early one's when it was started, else
    one run now."""
    build = _started.pop(name, None) or _spawn(name, argv, env)
    try:
        return build.result(timeout)
    finally:
        build.output.unlink(missing_ok=True)


def stop_all() -> None:
    """Ends the builds nobody asked for (the session ended first)."""
    for build in _started.values():
        build.proc.kill()
        build.proc.wait()
        build.output.unlink(missing_ok=True)
    _started.clear()
