"""Stopping a child process: a signal, a bounded wait, then SIGKILL."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Sends ``sig`` (if it still runs), waits ``timeout`` s, then SIGKILLs; returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
    code: int = proc.returncode
    return code
