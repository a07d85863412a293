"""Idle CPU of reading PodResources: daemons side by side, with ``--pod-resources`` off and on.

    python -m bench.podresources_idle [--rounds 3] [--seconds 600] [--pods 110]

Starts a PodResources server (this process, grpc.aio in a thread) listing ``--pods`` pods
that each hold one ``ate.dev/kvm`` unit, and, for each round, four fresh daemons without a
kubelet: two with ``--pod-resources off``, one on at the default 60 s interval, one at 1 s
(the cost of one List). Measures each daemon's CPU time and context switches over the
window (``bench.procstat``); two identical ``off`` daemons show the noise. Writes
``bench/results/<UTC time>-podresources-idle.json`` (every round, and the summary the
docs quote: docs/observability.md) and prints it.
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
from datetime import UTC, datetime
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


def one_round(base: Path, socket_path: str, seconds: float) -> dict[str, Any]:
    """Four fresh daemons side by side for ``seconds``: what each cost in that window."""
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
        before = {n: procstat.Snapshot.take(p.pid) for n, p in procs.items()}
        start = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        after = {n: procstat.Snapshot.take(p.pid) for n, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(10)
    daemons = {}
    for n in procs:
        cost = procstat.idle_cost(before[n], after[n], elapsed)
        daemons[n] = {
            "cpu_s": round(cost.cpu_s, 3),
            "millicores": round(1000 * cost.cpu_s / elapsed, 3),
            "switches_per_min": round(cost.switches_per_min, 1),
            "switches_by_thread": cost.by_thread,
        }
    return {"seconds": round(elapsed, 1), "loadavg_at_end": list(os.getloadavg()), "daemons": daemons}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every round: the ``off`` daemons' cost, and what ``on`` adds to it ([min, max])."""

    def span(values: list[float]) -> list[float]:
        return [round(min(values), 2), round(max(values), 2)]

    def extra(r: dict[str, Any], name: str) -> float:
        d = r["daemons"]
        off = (float(d["off-a"]["millicores"]) + float(d["off-b"]["millicores"])) / 2
        return float(d[name]["millicores"]) - off

    def engine(r: dict[str, Any], name: str) -> float:
        return 60 * float(r["daemons"][name]["switches_by_thread"].get("event_engine", 0)) / float(r["seconds"])

    return {
        "rounds": len(rounds),
        "off_millicores": span([r["daemons"][n]["millicores"] for r in rounds for n in ("off-a", "off-b")]),
        "off_pair_gap_millicores": round(
            max(abs(r["daemons"]["off-a"]["millicores"] - r["daemons"]["off-b"]["millicores"]) for r in rounds), 2
        ),
        "on_60s_extra_millicores": span([extra(r, "on-60s") for r in rounds]),
        # gRPC core's event_engine threads: where the extra wake-ups of `on` show (the
        # daemons' other threads also wake for any event in the host's /dev they watch).
        "off_event_engine_switches_per_min": span([engine(r, n) for r in rounds for n in ("off-a", "off-b")]),
        "on_60s_event_engine_switches_per_min": span([engine(r, "on-60s") for r in rounds]),
        # One List a second: its extra millicores are milliseconds of CPU per List.
        "list_cpu_ms": span([extra(r, "on-1s") for r in rounds]),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="podresources-idle-") as tmp:
        base = Path(tmp)
        (base / "pod-resources").mkdir()
        socket_path = str(base / "pod-resources" / "kubelet.sock")
        serve_in_thread(socket_path, args.pods)
        for i in range(args.rounds):
            rounds.append(one_round(base / f"round-{i}", socket_path, args.seconds))
    result = {
        "command": "python -m bench.podresources_idle " + " ".join(argv),
        "started_utc": stamp,
        "pods": args.pods,
        "machine": {"nproc": os.cpu_count(), "loadavg_at_end": list(os.getloadavg())},
        "rounds": rounds,
        "summary": summary(rounds),
    }
    text = json.dumps(result, indent=2)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stamp}-podresources-idle.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
