"""The probe's child process: ``python -m ate_devplugin.kvm.worker``.

Reads one request a line on stdin, a wire.Check, probes (probe.check) and writes the result
as one line on stdout, a wire.Checked; ends at the end of stdin. Both ends of the pipe read
and write it through kvm/wire.py, the prober's socket's protocol, so there is one encoding
and one bound on a line. The runner keeps one worker for many probes, or starts one per
probe; either way it imports nothing but the standard library and this package.

It ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent
decides when this ends) and answers a request it cannot read with ``prober-failed``.
"""

from __future__ import annotations

import signal
import sys
from typing import IO

from ate_devplugin.kvm import wire
from ate_devplugin.kvm.probe import ProbeResult, check
from ate_devplugin.kvm.reasons import Reason


def answer(line: bytes) -> bytes:
    try:
        request = wire.decode(line)
        if not isinstance(request, wire.Check):
            raise wire.WireError(f"a {type(request).__name__.lower()}, not a check")
        result = check(request.device, request.deadline_s)
    except wire.WireError as exc:
        result = _failed(f"the probe could not read its request: {exc}")
    try:
        return wire.encode(wire.Checked(result))
    except wire.WireError as exc:  # past the line's bound: the parent hears why, not nothing
        return wire.encode(wire.Checked(_failed(f"the probe's answer could not be written: {exc}")))


def _failed(text: str) -> ProbeResult:
    return ProbeResult(device="", reason=Reason.PROBER_FAILED, detail=text, duration_s=0.0)


def serve(requests: IO[bytes], results: IO[bytes]) -> None:
    while line := requests.readline():  # the parent's own short lines (decode bounds them)
        results.write(answer(line))
        results.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
