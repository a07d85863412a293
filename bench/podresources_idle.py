"""Idle CPU of reading PodResources: daemons side by side, with ``--pod-resources`` off and on.

    python -m bench.podresources_idle [--seconds 600] [--pods 110]

Starts a PodResources server (this process, grpc.aio in a thread) listing ``--pods`` pods
that each hold one ``ate.dev/kvm`` unit, and four daemons without a kubelet: two with
``--pod-resources off``, one on at the default 60 s interval, one at 1 s (the cost of one
List). Prints each daemon's CPU time over the window (``bench.procstat``) as JSON. Two
identical ``off`` daemons show the noise. README.md ("Which pods hold the device") quotes
the runs behind the default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from ate_devplugin.api.podresources.v1 import api_pb2 as pb
from ate_devplugin.api.podresources.v1 import api_pb2_grpc
from bench import procstat

VARIANTS = {
    "off-a": ["--pod-resources=off"],
    "off-b": ["--pod-resources=off"],
    "on-60s": ["--pod-resources=on", "--pod-resources-interval=60"],
    "on-1s": ["--pod-resources=on", "--pod-resources-interval=1"],
}


def listing(pods: int) -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name=f"worker-{i}",
                namespace="vm-workers",
                containers=[
                    pb.ContainerResources(
                        name="vmm", devices=[pb.ContainerDevices(resource_name="ate.dev/kvm", device_ids=[str(i)])]
                    )
                ],
            )
            for i in range(pods)
        ]
    )


class Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, response: pb.ListPodResourcesResponse) -> None:
        self.response = response

    async def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        return self.response


def serve_in_thread(socket_path: str, pods: int) -> None:
    started = threading.Event()

    async def serve() -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(Lister(listing(pods)), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{socket_path}")
        await server.start()
        started.set()
        await server.wait_for_termination()

    threading.Thread(target=asyncio.run, args=(serve(),), name="podresources", daemon=True).start()
    if not started.wait(30):
        raise RuntimeError("the PodResources server did not start")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--pods", type=int, default=110)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="podresources-idle-") as tmp:
        base = Path(tmp)
        (base / "pod-resources").mkdir()
        socket_path = str(base / "pod-resources" / "kubelet.sock")
        serve_in_thread(socket_path, args.pods)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, flags in VARIANTS.items():
                plugins = base / name / "device-plugins"
                plugins.mkdir(parents=True)
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "ate_devplugin", "run", f"--plugin-dir={plugins}",
                     "--metrics-address=127.0.0.1:0", "--log-format=json", f"--pod-resources-socket={socket_path}",
                     *flags],
                    stderr=(base / f"{name}.log").open("wb"), env=os.environ.copy(),
                )  # fmt: skip
            time.sleep(20)  # started, first List done
            before = {n: procstat.cpu_seconds(p.pid) for n, p in procs.items()}
            start = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - start
            after = {n: procstat.cpu_seconds(p.pid) for n, p in procs.items()}
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(10)
    result = {
        n: {"cpu_s": round(after[n] - before[n], 3), "millicores": round(1000 * (after[n] - before[n]) / elapsed, 3)}
        for n in procs
    }
    print(json.dumps({"seconds": round(elapsed, 1), "pods": args.pods, "daemons": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
