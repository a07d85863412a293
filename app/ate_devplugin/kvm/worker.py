"""The probe's child process: ``python -m ate_devplugin.kvm.worker``.

Reads one JSON request a line on stdin, ``{"device": "/dev/kvm", "deadline_s": 4.5}``,
probes (probe.check) and writes the result (ProbeResult.to_json) as one line on stdout;
ends at the end of stdin. The runner keeps one worker for many probes, or starts one per
probe; either way it imports nothing but the standard library and this package.

It ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the parent
decides when this ends) and answers a request it cannot read with ``prober-failed``.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import IO, Any

from ate_devplugin.kvm.probe import check
from ate_devplugin.kvm.reasons import Reason


def answer(line: str) -> dict[str, Any]:
    try:
        request = json.loads(line)
        device, deadline_s = str(request["device"]), float(request["deadline_s"])
    except (ValueError, KeyError, TypeError) as exc:
        return {
            "device": "",
            "passed": False,
            "reason": str(Reason.PROBER_FAILED),
            "message": f"the probe could not read its request: {exc}",
            "duration_s": 0.0,
        }
    return check(device, deadline_s).to_json()


def serve(requests: IO[str], results: IO[str]) -> None:
    while line := requests.readline():  # the parent's own short lines
        results.write(json.dumps(answer(line)) + "\n")
        results.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
