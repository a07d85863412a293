"""ate-devplugin, up and doing its job against the kubelet's real device manager.

Prepares a device root holding a ``kvm`` character node (the numbers of this host's
/dev/kvm), starts the kubelet device manager (our bench, built from k8s.io/kubernetes)
in a private mount namespace, runs the daemon there with its defaults, and shows what a
cluster would: registration, the node's capacity and one pod's allocation as the
container runtime would receive it. Then it keeps running until Ctrl-C.

Run it with ``make demo`` or, from the repository root, ``python -m tools.demo`` (root: it
needs a mount namespace and mknod).
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import make_device_root
from tests.harness.kubelet import KubeletBench, Namespace, built_versions, missing_prerequisites
from tests.harness.wait import wait_until

RESOURCE = "ate.dev/kvm"


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", flush=True)


def main() -> int:
    why = missing_prerequisites()
    if why:
        print(f"demo: {why}", file=sys.stderr)
        return 1
    versions = built_versions()
    if not versions:
        print("demo: no kubelet bench built; run tools/build-kubelet-bench.sh", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="ate-devplugin-demo-"))
    root = make_device_root(work / "dev", {"kvm": "/dev/kvm"})
    say(f"device root {root} holds a kvm node like this host's /dev/kvm")
    with Namespace() as ns, KubeletBench(ns, versions[-1], log_dir=work) as kubelet:
        kubelet.start()
        say(
            f"kubelet device manager {kubelet.info.get('kubernetes', versions[-1])} listening (log: {kubelet.log_path})"
        )
        daemon = DevicePluginDaemon(root, work, ns=ns)
        daemon.start()
        say(f"ate-devplugin running (log: {daemon.log_path}); metrics on http://127.0.0.1:{daemon.port}/metrics")
        kubelet.wait(RESOURCE, allocatable=4096, timeout=60)
        wait_until(daemon.ready, 30, "readiness")
        capacity, allocatable = kubelet.capacity().of(RESOURCE)
        say(f"registered: node capacity {RESOURCE}={capacity}, allocatable={allocatable}; /readyz is 200")
        alloc = kubelet.allocate("demo-pod", "microvm", {RESOURCE: 1})
        say("pod demo-pod, container microvm, requests ate.dev/kvm: 1; the runtime gets:")
        print(json.dumps({k: v for k, v in asdict(alloc).items() if k != "allocate_s"}, indent=2), flush=True)
        say("running; remove or recreate a node in the device root to see health change. Ctrl-C stops.")
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            pass
        say("stopping")
        # Ctrl-C in a terminal reaches the daemon too; otherwise stop it as the kubelet would.
        assert daemon.proc is not None
        code = daemon.proc.poll()
        if code is None:
            code = daemon.stop()
        say(f"daemon exited with {code}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
