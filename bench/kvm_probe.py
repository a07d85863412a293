"""What the KVM probe costs: per probe, and a probing process at a period, idle otherwise.

    python -m bench.kvm_probe [--probes 200] [--period 60] [--seconds 600] [--device /dev/kvm]

Needs a KVM device this process may open (root here). Three parts:

* ``per_probe``: ``--probes`` probes back to back through ``kvm/runner.py``, once with one
  worker for every probe (``reuse``, the default) and once with a worker per probe. CPU
  per probe = this process's CPU (the event loop's side: ``time.process_time``) plus the
  workers' (exact, where /proc's ticks are 10 ms): the reused worker's from its CPU-time
  clock while it lives, once started and warm; the fresh workers' from
  ``getrusage(RUSAGE_CHILDREN)`` once they are reaped. The reused worker's start and first
  probe are measured apart (a prober that probes once). Wall time per probe as the caller
  sees it, and the probe's own duration inside the worker.
* ``at_period``: two processes side by side for ``--seconds``: ``host`` probing every
  ``--period`` seconds with a reused worker (what the prober of docs/kvm-health.md will do), and ``host``
  with no prober at all (an idle asyncio process: the floor). CPU and context switches
  per minute of each (the prober's worker included), from /proc (``bench.procstat``).
* ``daemon``: in the same window, our daemon itself (``ate-devplugin run``, no kubelet: its
  agent waits, idle) over a device root holding a ``10:232`` node, once with
  ``--kvm-probe local`` at ``--period`` (the daemon and its probe worker) and once with
  ``--kvm-probe off``: what wiring the probe adds to the idle daemon.
* ``daemon-socket`` and ``prober``: in the same window, what the chart runs by default: our
  daemon with ``--kvm-probe socket`` (hearing only this process's uid and gid) and its prober
  (``ate-devplugin probe``, the prober pod's command, and its probe worker) probing the real
  device at ``--period`` for it over the socket.
* the Go peer, in the same window: the kubelet's Go stub device plugin registered with a
  kubelet bench (its device manager, streaming, idle), and beside it our daemon registered
  the same way, probing its ``10:232`` node at ``--period``; ``registered_ratio`` is ours
  over the stub's CPU and wake-ups.
* ``budget``: the cost per hour at the default 60 s period from the per-probe figure,
  as a share of one core (the budget is 1 %).

Writes ``bench/results/<UTC time>-kvm-probe.json`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ate_devplugin.kvm.runner import ProbeRunner
from bench import procstat
from bench.peers import UNITS, Env
from bench.stats import percentile
from tests.harness.daemon import DevicePluginDaemon

RESULTS = Path(__file__).resolve().parent / "results"
PROBE_TIMEOUT_S = 5.0
KUBELET = "1.37"  # the kubelet bench both registered peers run next to
KVM_RESOURCE = "ate.dev/kvm"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _run(prober: ProbeRunner, device: str, probes: int) -> tuple[list[float], list[float]]:
    """Wall seconds per probe as the caller sees it, and each probe's own duration."""
    wall, inside = [], []
    for _ in range(probes):
        start = time.perf_counter()
        result = await prober.probe(device, PROBE_TIMEOUT_S)
        wall.append(time.perf_counter() - start)
        if not result.passed:
            raise RuntimeError(f"the probe failed: {result.reason}: {result.message}")
        inside.append(result.duration_s)
    return wall, inside


async def _cost(device: str, probes: int, reuse: bool) -> tuple[float, float, list[float], list[float]]:
    """(this process's CPU s, the workers' CPU s, wall, inside) of ``probes`` probes by a
    fresh prober, its workers reaped."""
    prober = ProbeRunner(reuse=reuse)
    own, children = time.process_time(), _children_cpu()
    try:
        wall, inside = await _run(prober, device, probes)
    finally:
        await prober.close()
    for _ in range(100):  # the child watcher reaps in its own thread
        if prober._worker is None and _children_cpu() > children:
            break
        await asyncio.sleep(0.01)
    return time.process_time() - own, _children_cpu() - children, wall, inside


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


async def _reused(device: str, probes: int) -> tuple[float, float, list[float], list[float]]:
    """(this process's CPU s, the worker's CPU s, wall, inside) of ``probes`` probes by a
    worker already started and warm, read from the live worker's CPU clock."""
    prober = ProbeRunner(reuse=True)
    try:
        await _run(prober, device, 2)
        assert prober._worker is not None
        worker = prober._worker.pid
        own, theirs = time.process_time(), procstat.exact_cpu_seconds(worker)
        wall, inside = await _run(prober, device, probes)
        return time.process_time() - own, procstat.exact_cpu_seconds(worker) - theirs, wall, inside
    finally:
        await prober.close()


async def per_probe(device: str, probes: int) -> dict[str, Any]:
    await _cost(device, 3, reuse=True)  # warm: imports, page cache
    start_own, start_workers, _, _ = await _cost(device, 1, reuse=True)
    own, workers, wall, inside = await _reused(device, probes)
    reused = {
        "probes": probes,
        "worker_start_and_one_probe_cpu_ms": _ms(start_own + start_workers),
        "cpu_ms_per_probe": _ms((own + workers) / probes),
        "loop_cpu_ms_per_probe": _ms(own / probes),
        "worker_cpu_ms_per_probe": _ms(workers / probes),
        "wall_p50_ms": _ms(percentile(wall, 50)),
        "wall_p99_ms": _ms(percentile(wall, 99)),
        "inside_p50_ms": _ms(percentile(inside, 50)),
    }
    own, workers, wall, inside = await _cost(device, probes, reuse=False)
    fresh = {
        "probes": probes,
        "cpu_ms_per_probe": _ms((own + workers) / probes),
        "loop_cpu_ms_per_probe": _ms(own / probes),
        "worker_cpu_ms_per_probe": _ms(workers / probes),
        "wall_p50_ms": _ms(percentile(wall, 50)),
        "wall_p99_ms": _ms(percentile(wall, 99)),
        "inside_p50_ms": _ms(percentile(inside, 50)),
    }
    return {"reuse": reused, "worker_per_probe": fresh}


# --- a probing process at a period ------------------------------------------------


async def host(period: float, device: str) -> None:
    """Probes every ``period`` seconds (0: no prober, only an idle loop); prints
    ``worker <pid>`` after the first probe, then runs until killed."""
    if not period:
        print("worker 0", flush=True)
        await asyncio.Event().wait()
    prober = ProbeRunner()
    first = True
    while True:
        result = await prober.probe(device, PROBE_TIMEOUT_S)
        if first:
            assert prober._worker is not None
            print(f"worker {prober._worker.pid}" if result.passed else f"failed {result.message}", flush=True)
            first = False
        await asyncio.sleep(period)


def _start_host(period: float, device: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.kvm_probe", "host", "--period", str(period), "--device", device],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "worker":
        proc.kill()
        raise RuntimeError(f"the probing host did not start: {line}")
    return proc, int(line[1])


def _start_daemon(probe: str, period: float, workdir: Path) -> tuple[subprocess.Popen[str], int]:
    """Our daemon over a device root of one 10:232 node; its probe worker's pid (0: none)."""
    root = workdir / probe
    (root / "dev").mkdir(parents=True)
    os.mknod(root / "dev" / "kvm", stat.S_IFCHR | 0o666, os.makedev(10, 232))
    argv = [sys.executable, "-m", "ate_devplugin", "run", "--device-root", str(root / "dev"),
            "--plugin-dir", str(root), "--cdi-dir", str(root / "cdi"), "--metrics-address", "127.0.0.1:0",
            "--kvm-probe", probe, "--kvm-probe-period", str(period), "--log-format", "json"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    if probe != "local":
        time.sleep(2)  # started, idle
        return proc, 0
    try:
        return proc, _probe_worker(proc.pid)
    except RuntimeError:
        proc.kill()
        raise


def _start_socket_pair(period: float, device: str, workdir: Path) -> tuple[list[subprocess.Popen[str]], int]:
    """Our daemon in socket mode and its prober, as the chart runs them; the prober's probe
    worker's pid, once its first report is in."""
    root = workdir / "socket"
    (root / "dev").mkdir(parents=True)
    os.mknod(root / "dev" / "kvm", stat.S_IFCHR | 0o666, os.makedev(10, 232))
    sock = str(root / "run" / "prober.sock")
    argv = [sys.executable, "-m", "ate_devplugin", "run", "--device-root", str(root / "dev"),
            "--plugin-dir", str(root), "--cdi-dir", str(root / "cdi"), "--metrics-address", "127.0.0.1:0",
            "--kvm-probe", "socket", "--kvm-probe-socket", sock, "--kvm-probe-period", str(period),
            "--kvm-prober-uid", str(os.geteuid()), "--kvm-prober-gid", str(os.getegid()),
            "--log-format", "json"]  # fmt: skip
    daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    probe_argv = ["probe", "--kvm-probe-socket", sock, "--device", f"{KVM_RESOURCE}={device}"]
    prober = subprocess.Popen([sys.executable, "-m", "ate_devplugin", *probe_argv],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        return [daemon, prober], _probe_worker(prober.pid)
    except RuntimeError:
        daemon.kill()
        prober.kill()
        raise


@contextlib.contextmanager
def registered(period: float, workdir: Path) -> Iterator[dict[str, list[int]]]:
    """The Go stub, and our daemon probing a ``10:232`` node at ``period``, each registered
    with a kubelet bench of its own (``bench.peers.Env``) and idle; their pids."""
    with contextlib.ExitStack() as stack:
        stub = stack.enter_context(Env("go-stub", KUBELET, work_root=workdir))
        env = Env("ours", KUBELET, work_root=workdir)  # its namespace and kubelet; the daemon is ours here
        stack.callback(env.close)
        env.open(start_plugin=False)
        root = workdir / "registered" / "dev"
        root.mkdir(parents=True)
        os.mknod(root / "kvm", stat.S_IFCHR | 0o666, os.makedev(10, 232))
        daemon = DevicePluginDaemon(
            root,
            workdir / "registered",
            ns=env.ns,
            config=f"resources:\n  - name: {KVM_RESOURCE}\n    devices: [/dev/kvm]\n",
            args=["--log-level", "info", "--kvm-probe", "local", "--kvm-probe-period", str(period)],
        )
        stack.enter_context(daemon)
        env.k.wait(KVM_RESOURCE, capacity=UNITS, allocatable=UNITS)
        assert daemon.proc is not None
        yield {"go-stub": stub.p.pids, "ours-probing": [daemon.proc.pid, _probe_worker(daemon.proc.pid)]}


def _probe_worker(pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError("the daemon started no probe worker")


def at_period(device: str, period: float, seconds: float, workdir: Path) -> dict[str, Any]:
    hosts = {
        "probing": _start_host(period, device),
        "no-prober": _start_host(0, device),
        "daemon-probing": _start_daemon("local", period, workdir),
        "daemon-no-probe": _start_daemon("off", period, workdir),
    }
    pids = {name: [p.pid] + ([worker] if worker else []) for name, (p, worker) in hosts.items()}
    (daemon, prober), prober_worker = _start_socket_pair(period, device, workdir)
    pids["daemon-socket"] = [daemon.pid]
    pids["prober"] = [prober.pid, prober_worker]
    try:
        with registered(period, workdir) as peers:
            pids.update(peers)
            before = {name: [procstat.Snapshot.take(pid) for pid in group] for name, group in pids.items()}
            start = time.monotonic()
            time.sleep(seconds)
            elapsed = time.monotonic() - start
            after = {name: [procstat.Snapshot.take(pid) for pid in group] for name, group in pids.items()}
            rss = {name: sum(procstat.rss_bytes(pid) for pid in group) for name, group in pids.items()}
    finally:
        for proc in [*(p for p, _ in hosts.values()), daemon, prober]:
            proc.kill()
            proc.wait(10)
    out: dict[str, Any] = {"period_s": period, "seconds": round(elapsed, 1)}
    for name in pids:
        costs = [procstat.idle_cost(b, a, elapsed) for b, a in zip(before[name], after[name], strict=True)]
        cpu = sum(c.cpu_s for c in costs)
        out[name] = {
            "cpu_s": round(cpu, 3),
            "millicores": round(1000 * cpu / elapsed, 3),
            "switches_per_min": round(sum(c.switches_per_min for c in costs), 1),
            "processes": len(costs),
            "rss_mib": round(rss[name] / 2**20, 1),
        }
    ours, stub = out["ours-probing"], out["go-stub"]
    out["registered_ratio"] = {
        key: round(ours[key] / stub[key], 2) if stub[key] else "n/a (the stub's is 0)"
        for key in ("millicores", "switches_per_min", "rss_mib")
    }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["run", "host"], default="run")
    parser.add_argument("--device", default="/dev/kvm")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.mode == "host":
        asyncio.run(host(args.period, args.device))
        return 0
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    probe = asyncio.run(per_probe(args.device, args.probes))
    with tempfile.TemporaryDirectory(prefix="kvm-probe-bench-") as workdir:
        period = at_period(args.device, args.period, args.seconds, Path(workdir))
    per_hour_s = probe["reuse"]["cpu_ms_per_probe"] / 1000.0 * 3600.0 / 60.0
    result = {
        "command": "python -m bench.kvm_probe " + " ".join(argv),
        "started_utc": stamp,
        "device": args.device,
        "machine": {"nproc": os.cpu_count(), "loadavg_at_end": list(os.getloadavg()), "kernel": os.uname().release},
        "per_probe": probe,
        "at_period": period,
        "budget": {
            "period_s": 60,
            "cpu_s_per_hour": round(per_hour_s, 3),
            "core_percent": round(100 * per_hour_s / 3600.0, 4),
            "limit_percent": 1.0,
        },
    }
    text = json.dumps(result, indent=2)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stamp}-kvm-probe.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
