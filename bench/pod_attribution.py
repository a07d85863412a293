"""What knowing which pods hold the device costs, as the node fills: ours with
``--pod-resources on`` (the default) and ``off``, next to squat/generic-device-plugin.

    python -m bench.pod_attribution [--sizes 0,110,250] [--admissions 1000] [--kubelet 1.35]
                                    [--generic-device-plugin PATH] [--baseline CHECKOUT] [--quick]

Every peer runs in its own namespace next to its own kubelet bench, which also serves the
kubelet's PodResources API (the kubelet's own server over its device manager,
tests/kubelet_bench). With ``--baseline``, a fourth peer is ours as another checkout of
this repository has it (``git worktree add /tmp/base <rev>``), ``on``: before beside after,
in the same rounds. For each size, the node first holds that many pods with a unit each
(``vm-workers/worker-<i>``), then:

* ``burst``: admissions back to back through the kubelet, in blocks taking turns between
  the peers, each pod ending once the next is admitted (the node stays at size + 1). Per
  admission: CPU (the process's CPU clock, every thread) and wake-ups (context switches of
  every thread), each block's window closed ``SETTLE_S`` after its last admission so the
  List it asked for is in it; RSS after.
* ``steady``, ``paced``: admissions ten a second, and one a second (``pace_s``, longer
  than the List's coalescing: each is listed on its own), all peers' in the same rounds.
  CPU per admission, the idle time between them included.
* ``rewrites`` (ours on and off): the kubelet's checkpoint rewritten by this process as the
  kubelet writes it, with no admission, as often as admissions come back to back, and
  ``rewrites_paced``, one every ``pace_s``: per rewrite, CPU, wake-ups, the Lists it made.
* ``lists`` (ours on): the Lists the daemon made per burst admission, and what one List
  costs at this size, measured in this process with the daemon's own code against the same
  kubelet's socket: the call on a channel of its own (``lister.list_pods``), reading the answer
  (``answer.Reader``: as the daemon does, the entries of the last answer remembered; and
  every entry walked, ``answer.read_holdings``), and the whole of
  ``PodResourcesWatch.list_once`` (the call, the read in its worker thread, the series; the
  rest is the worker's thread, the span and the series).
* ``breakdown``: the burst's extra CPU per admission (on minus off); the rewrites' (on
  minus off) split into the Lists and the rest (the rewrites' events and what the daemon
  does with them); one List as the daemon pays it, one a second (cold).
* ``latency`` (ours on): from the start of an admission until its pod is in /metrics, on a
  quiet node and for the last pod of a burst.

Then, at the largest size: ``deletion``, from a pod's end until its series is gone (the
kubelet writes nothing then: the fallback List, ``--pod-resources-interval``), and
``idle``, every peer left alone for ``idle_s``. Writes
``bench/results/<UTC time>-pod-attribution.json`` (the figures docs/benchmarks.md and
chart/README.md quote; ``-quick.json`` with ``--quick``) and prints its path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry

from ate_devplugin.config import ResourceConfig
from ate_devplugin.host.devices import Discovery
from ate_devplugin.observability.metrics import PodResourcesMetrics
from ate_devplugin.podresources.answer import Reader, Wanted, read_holdings
from ate_devplugin.podresources.lister import list_pods
from ate_devplugin.podresources.watch import PodResourcesWatch
from ate_devplugin.settings import PodResourcesSettings
from ate_devplugin.view import build
from bench import machine, procstat
from bench.peers import GDP, GDP_ENV, Env, gdp_binary, gdp_missing
from tests.harness.kubelet import (
    CHECKPOINT_FILE,
    PLUGIN_DIR,
    POD_RESOURCES_SOCKET,
    bench_binary,
    built_versions,
    missing_prerequisites,
)
from tests.harness.net import http_get

log = logging.getLogger("bench")

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1024 * 1024
ON, OFF, BASE = "on", "off", "on-baseline"
RESOURCE = "ate.dev/kvm"
NAMESPACE = "vm-workers"
# Between two back-to-back checkpoint rewrites: about an admission's time through the kubelet.
REWRITE_GAP_S = 0.004
# After a block's last admission: longer than the daemon's gap between Lists (2 s), so
# the List the block asked for falls in its window. Every peer waits as long.
SETTLE_S = 2.5
LABELS = {
    ON: "ate-devplugin, --pod-resources on (the default)",
    OFF: "ate-devplugin, --pod-resources off",
    GDP: "squat/generic-device-plugin (Go)",
    BASE: "ate-devplugin of the baseline checkout, --pod-resources on",
}


@dataclass(frozen=True)
class Sizes:
    sizes: tuple[int, ...] = (0, 110, 250)
    admissions: int = 1000  # back to back, per size and peer
    block: int = 250  # admissions a peer makes before the next one's turn
    steady: int = 100
    steady_s: float = 0.1
    paced: int = 20
    pace_s: float = 1.0
    quiet_latencies: int = 5
    burst_latencies: int = 3
    burst: int = 50  # admissions of a burst whose last pod's latency is measured
    list_rounds: int = 50  # Lists per part, in this process
    idle_s: float = 300.0
    interval_s: float | None = None  # ours' --pod-resources-interval (None: its default)


FULL = Sizes()
QUICK = Sizes(
    sizes=(0, 5),
    admissions=40,
    block=20,
    steady=5,
    steady_s=0.1,
    paced=3,
    pace_s=0.7,
    quiet_latencies=2,
    burst_latencies=1,
    burst=5,
    list_rounds=5,
    idle_s=3.0,
    interval_s=3.0,
)


def _cpu(pids: list[int]) -> float:
    return sum(procstat.exact_cpu_seconds(p) for p in pids)


def _switches(pids: list[int]) -> int:
    return sum(n for p in pids for _, n in procstat.thread_switches(p).values())


class Window:
    """CPU seconds and context switches of a peer's processes, summed over windows."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.switches = 0
        self.seconds = 0.0

    @contextlib.contextmanager
    def measure(self, pids: list[int]) -> Iterator[None]:
        cpu, switches, begin = _cpu(pids), _switches(pids), time.monotonic()
        yield
        self.cpu_s += _cpu(pids) - cpu
        self.switches += _switches(pids) - switches
        self.seconds += time.monotonic() - begin


def _metrics_text(env: Env) -> str:
    port = env.p.metrics_port()
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return body.decode()


def _lists(env: Env) -> float:
    text = _metrics_text(env)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ate_devplugin_pod_resources_requests_total{") and 'result="success"' in line
    )


def _pod_shown(env: Env, pod: str) -> bool:
    return f'pod="{pod}"' in _metrics_text(env)


class Bench:
    def __init__(self, sizes: Sizes, release: str, baseline: Path | None = None, work_root: Path | None = None) -> None:
        self.s = sizes
        self.release = release
        self.baseline = baseline
        self.work_root = work_root
        self.envs: dict[str, Env] = {}
        self.counter = 0
        self.previous: dict[str, str | None] = {}

    # -- peers ------------------------------------------------------------------

    def open(self) -> None:
        interval = () if self.s.interval_s is None else ("--pod-resources-interval", f"{self.s.interval_s:g}")
        args = {ON: ("--pod-resources", "on", *interval), OFF: ("--pod-resources", "off")}
        args[BASE] = args[ON]
        peers = [ON, OFF] + ([] if gdp_missing() else [GDP]) + ([BASE] if self.baseline else [])
        for key in peers:
            env = Env(
                GDP if key == GDP else "ours",
                self.release,
                work_root=self.work_root,
                pod_resources=True,
                daemon_args=args.get(key, ()),
                daemon_env={"PYTHONPATH": f"{self.baseline}/app:{self.baseline}"} if key == BASE else None,
            )
            self.envs[key] = env
            env.open()
            self.previous[key] = None

    def close(self) -> None:
        for env in self.envs.values():
            env.close()

    def admit(self, key: str) -> str:
        """One pod admitted (a unit of the resource), the one admitted before it ended."""
        env = self.envs[key]
        self.counter += 1
        pod = f"admitted-{self.counter}"
        env.k.allocate(pod, "vmm", {RESOURCE: 1}, pod_name=pod, namespace=NAMESPACE)
        before, self.previous[key] = self.previous[key], pod
        if before is not None:
            env.k.remove_pod(before)
        return pod

    def end_admitted(self) -> None:
        for key, pod in self.previous.items():
            if pod is not None:
                self.envs[key].k.remove_pod(pod)
            self.previous[key] = None

    def fill(self, size: int) -> None:
        """Every peer's node holds ``size`` pods with a unit each (more are added, never removed)."""
        for env in self.envs.values():
            held = {p["uid"] for p in env.k.pods()}
            for i in range(size):
                uid = f"held-{i}"
                if uid not in held:
                    env.k.allocate(uid, "vmm", {RESOURCE: 1}, pod_name=f"worker-{i}", namespace=NAMESPACE)

    # -- figures ------------------------------------------------------------------

    @property
    def listing(self) -> list[str]:
        """The peers that list: ours on, and its baseline."""
        return [key for key in (ON, BASE) if key in self.envs]

    def _lists(self) -> dict[str, float]:
        return {key: _lists(self.envs[key]) for key in self.listing}

    def burst(self) -> dict[str, Any]:
        windows = {key: Window() for key in self.envs}
        lists_before = self._lists()
        done = 0
        while done < self.s.admissions:
            n = min(self.s.block, self.s.admissions - done)
            for key, env in self.envs.items():
                with windows[key].measure(env.p.pids):
                    for _ in range(n):
                        self.admit(key)
                    time.sleep(SETTLE_S)
            done += n
        lists = self._lists()
        out: dict[str, Any] = {}
        for key, w in windows.items():
            out[key] = {
                "admissions": done,
                "cpu_ms_per_admission": round(w.cpu_s * 1000 / done, 4),
                "switches_per_admission": round(w.switches / done, 2),
                "rss_mib": round(procstat.total_rss_bytes(self.envs[key].p.pids) / MIB, 1),
            }
        for key in self.listing:
            out[key]["lists"] = int(lists[key] - lists_before[key])
            out[key]["lists_per_admission"] = round((lists[key] - lists_before[key]) / done, 4)
        return out

    def paced(self, count: int, pace_s: float) -> dict[str, Any]:
        lists_before = self._lists()
        windows = self._rounds(list(self.envs), self.admit, count, pace_s)
        return self._per(windows, "admission", count, lists_before, admissions=count, pace_s=pace_s)

    def rewrites(self, count: int, pace_s: float) -> dict[str, Any]:
        """The kubelet's checkpoint rewritten with no admission (by this process, as the
        kubelet writes it), ``count`` times ``pace_s`` apart: what attribution costs ours
        per admission, the Allocate's noise left out."""
        lists_before = self._lists()
        ours = [key for key in (ON, OFF, BASE) if key in self.envs]
        windows = self._rounds(ours, lambda key: _rewrite_checkpoint(self.envs[key]), count, pace_s)
        return self._per(windows, "rewrite", count, lists_before, rewrites=count, pace_s=pace_s)

    def _per(
        self, windows: dict[str, Window], what: str, count: int, lists_before: dict[str, float], **given: float
    ) -> dict[str, Any]:
        """Each peer's CPU and wake-ups per ``what`` (``count`` of them), and the Lists of those that list."""
        out: dict[str, Any] = {
            key: {
                **given,
                f"cpu_ms_per_{what}": round(w.cpu_s * 1000 / count, 4),
                f"switches_per_{what}": round(w.switches / count, 2),
            }
            for key, w in windows.items()
        }
        for key, lists in self._lists().items():
            out[key][f"lists_per_{what}"] = round((lists - lists_before[key]) / count, 4)
        return out

    def _rounds(self, keys: list[str], act: Callable[[str], object], count: int, pace_s: float) -> dict[str, Window]:
        """``act`` on every peer of ``keys`` in turn, ``count`` rounds ``pace_s`` apart, each
        peer measured from the first round until ``SETTLE_S`` after the last."""
        windows = {key: Window() for key in keys}
        with contextlib.ExitStack() as stack:
            for key in keys:
                stack.enter_context(windows[key].measure(self.envs[key].p.pids))
            tick = time.monotonic()
            for _ in range(count):
                for key in keys:
                    act(key)
                tick += pace_s
                time.sleep(max(0.0, tick - time.monotonic()))
            time.sleep(SETTLE_S)
        return windows

    def latency(self) -> dict[str, Any]:
        """From the start of an admission until its pod shows in ours' /metrics."""
        quiet, burst = [], []
        for _ in range(self.s.quiet_latencies):
            time.sleep(SETTLE_S)
            quiet.append(self._until_shown(lambda: self.admit(ON)))
        for _ in range(self.s.burst_latencies):
            time.sleep(SETTLE_S)
            for _ in range(self.s.burst - 1):
                self.admit(ON)
            burst.append(self._until_shown(lambda: self.admit(ON)))
        return {
            "quiet_ms": quiet,
            "quiet_max_ms": max(quiet),
            "burst_last_ms": burst,
            "burst_last_max_ms": max(burst),
        }

    def _until_shown(self, admit: Callable[[], str], timeout_s: float = 30.0) -> float:
        begin = time.monotonic()
        pod = admit()
        while not _pod_shown(self.envs[ON], pod):
            if time.monotonic() - begin > timeout_s:
                raise TimeoutError(f"{pod} not in /metrics after {timeout_s:.0f} s")
            time.sleep(0.01)
        return round((time.monotonic() - begin) * 1000, 1)

    def deletion(self, size: int) -> dict[str, Any]:
        """From a held pod's end until its series is gone from ours' /metrics."""
        env = self.envs[ON]
        pod = f"worker-{size - 1}"
        if not _pod_shown(env, pod):
            raise RuntimeError(f"{pod} is not in /metrics before its end")
        begin = time.monotonic()
        env.k.remove_pod(f"held-{size - 1}")
        bound = self.s.interval_s or 60.0
        while _pod_shown(env, pod):
            if time.monotonic() - begin > bound + 30:
                raise TimeoutError(f"{pod} still in /metrics {bound + 30:.0f} s after its end")
            time.sleep(0.2)
        return {"size": size, "gone_s": round(time.monotonic() - begin, 2), "interval_s": bound}

    def lists(self, size: int) -> dict[str, Any]:
        """What one List costs at this size, in this process, with the daemon's own code."""
        socket = str(self.envs[ON].ns.path(POD_RESOURCES_SOCKET))
        return asyncio.run(_list_parts(socket, self.envs[ON].ns.path(PLUGIN_DIR), self.s.list_rounds, size))

    def idle(self) -> dict[str, Any]:
        windows = {key: Window() for key in self.envs}
        with contextlib.ExitStack() as stack:
            for key, env in self.envs.items():
                stack.enter_context(windows[key].measure(env.p.pids))
            time.sleep(self.s.idle_s)
        return {
            key: {
                "seconds": round(w.seconds, 1),
                "cpu_ms_per_s": round(w.cpu_s * 1000 / w.seconds, 4),
                "switches_per_s": round(w.switches / w.seconds, 2),
                "rss_mib": round(procstat.total_rss_bytes(self.envs[key].p.pids) / MIB, 1),
            }
            for key, w in windows.items()
        }

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peers": {key: LABELS[key] for key in self.envs}, "sizes": {}}
        for size in self.s.sizes:
            log.info("== %d pods on the node", size)
            self.fill(size)
            at: dict[str, Any] = {"pods": size}
            at["burst"] = self.burst()
            at["steady"] = self.paced(self.s.steady, self.s.steady_s)
            at["paced"] = self.paced(self.s.paced, self.s.pace_s)
            self.end_admitted()
            at["rewrites"] = self.rewrites(self.s.admissions, REWRITE_GAP_S)
            at["rewrites_paced"] = self.rewrites(self.s.paced, self.s.pace_s)
            at["lists"] = self.lists(size)
            at["latency"] = self.latency()
            self.end_admitted()
            at["ratios"] = _ratios(at, GDP in self.envs, BASE in self.envs)
            at["breakdown"] = _breakdown(at, ON)
            if BASE in self.envs:
                at["breakdown_baseline"] = _breakdown(at, BASE)
            out["sizes"][str(size)] = at
        largest = max(self.s.sizes)
        if largest:
            out["deletion"] = self.deletion(largest)
            self.fill(largest)
        out["idle"] = self.idle()
        return out


def _rewrite_checkpoint(env: Env) -> None:
    """As the kubelet's device manager writes it: its content in a temporary file renamed over it."""
    path = env.ns.path(f"{PLUGIN_DIR}/{CHECKPOINT_FILE}")
    tmp = path.with_name(".bench-checkpoint")
    tmp.write_bytes(path.read_bytes())
    os.rename(tmp, path)


def _ratios(at: dict[str, Any], with_peer: bool, with_baseline: bool) -> dict[str, Any]:
    def ratio(kind: str, a: str, b: str) -> float:
        x: float = at[kind][a]["cpu_ms_per_admission"] / at[kind][b]["cpu_ms_per_admission"]
        return round(x, 3)

    out: dict[str, Any] = {}
    for kind in ("burst", "steady", "paced"):
        out[f"{kind}_on_over_off"] = ratio(kind, ON, OFF)
        if with_peer:
            out[f"{kind}_on_over_peer"] = ratio(kind, ON, GDP)
            out[f"{kind}_off_over_peer"] = ratio(kind, OFF, GDP)
        if with_baseline:
            out[f"{kind}_baseline_over_off"] = ratio(kind, BASE, OFF)
    return out


def _breakdown(at: dict[str, Any], key: str) -> dict[str, Any]:
    """Where the extra CPU per admission of ``key`` goes: the checkpoint's rewrites alone
    cost it (``key`` minus off, per back-to-back rewrite), of which, for ours on, the Lists
    (the Lists per rewrite times one List's CPU in this process) and the rest (the rewrites'
    events and what the daemon does with them); and one List as the daemon pays it, cold
    (per paced rewrite)."""

    def extra(kind: str, figure: str) -> float:
        x: float = at[kind][key][figure] - at[kind][OFF][figure]
        return x

    rewrite = extra("rewrites", "cpu_ms_per_rewrite")
    out = {
        "extra_cpu_ms_per_admission": round(extra("burst", "cpu_ms_per_admission"), 4),
        "extra_switches_per_admission": round(extra("burst", "switches_per_admission"), 2),
        "rewrite_cpu_ms": round(rewrite, 4),
        "rewrite_switches": round(extra("rewrites", "switches_per_rewrite"), 2),
    }
    if key == ON:
        lists = at["rewrites"][ON]["lists_per_rewrite"] * at["lists"]["list_once_cpu_ms"]
        out["rewrite_lists_cpu_ms"] = round(lists, 4)
        out["rewrite_events_cpu_ms"] = round(rewrite - lists, 4)
    if paced_lists := at["rewrites_paced"][key]["lists_per_rewrite"]:
        out["cold_list_cpu_ms"] = round(extra("rewrites_paced", "cpu_ms_per_rewrite") / paced_lists, 4)
    return out


async def _list_parts(socket: str, plugin_dir: Path, rounds: int, size: int) -> dict[str, Any]:
    """CPU of one List's parts, in this process (``time.process_time``: every thread)."""
    await list_pods(socket, 5.0)  # warm: the first channel's setup
    begin = time.process_time()
    for _ in range(rounds):
        data = await list_pods(socket, 5.0)
    call = (time.process_time() - begin) / rounds
    wanted = Wanted(frozenset({RESOURCE}))
    begin = time.process_time()
    for _ in range(rounds):
        held = read_holdings(data, wanted)
    fresh = (time.process_time() - begin) / rounds
    if sum(held.held.values()) < size:
        raise RuntimeError(f"the List held {sum(held.held.values())} units, fewer than the {size} pods")
    reader = Reader()
    reader.read(data, wanted)
    begin = time.process_time()
    for _ in range(rounds):
        reader.read(data, wanted)
    remembered = (time.process_time() - begin) / rounds
    settings = PodResourcesSettings(
        pod_resources_socket=socket,
        pod_resources_interval=60.0,
        pod_resources_debounce_s=0.5,
        pod_resources_gap_s=2.0,
        pod_resources_timeout_s=5.0,
        plugin_dir=str(plugin_dir),
        mode="device-plugin",
    )
    watch = PodResourcesWatch(settings, PodResourcesMetrics(CollectorRegistry()), NoOpTracer())
    try:
        resources = (ResourceConfig(name=RESOURCE, devices=("/dev/bench/kvm",)),)
        await watch.on_resources(resources)
        watch.on_view(build(resources, {RESOURCE: Discovery(nodes=(), complete=True)}, {}))
        await watch.list_once()  # warm: the worker thread, the series made
        begin = time.process_time()
        for _ in range(rounds):
            await watch.list_once()
        whole = (time.process_time() - begin) / rounds
    finally:
        await watch.stop(1.0)
    return {
        "answer_bytes": len(data),
        "containers": len(held.held),
        "call_cpu_ms": round(call * 1000, 4),
        "read_every_entry_cpu_ms": round(fresh * 1000, 4),
        "read_cpu_ms": round(remembered * 1000, 4),
        "list_once_cpu_ms": round(whole * 1000, 4),
        "rest_cpu_ms": round((whole - call - remembered) * 1000, 4),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI (its numbers mean nothing)")
    parser.add_argument("--sizes", help="pods on the node, comma-separated (default 0,110,250)")
    parser.add_argument("--admissions", type=int, help="back-to-back admissions per size and peer (default 1000)")
    parser.add_argument("--kubelet", default="1.35", help="kubelet release of the bench (default 1.35)")
    parser.add_argument("--generic-device-plugin", type=Path, help=f"the peer's binary (default: ${GDP_ENV})")
    parser.add_argument("--baseline", type=Path, help="a checkout whose daemon runs beside, --pod-resources on")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    why = missing_prerequisites()
    if why or args.kubelet not in built_versions():
        print(f"bench.pod_attribution: {why or f'no kubelet bench {args.kubelet} built'}", file=sys.stderr)
        return 2
    if args.generic_device_plugin is not None:
        os.environ[GDP_ENV] = str(args.generic_device_plugin.resolve())
    sizes = QUICK if args.quick else FULL
    if args.sizes:
        sizes = replace(sizes, sizes=tuple(int(x) for x in args.sizes.split(",")))
    if args.admissions:
        sizes = replace(sizes, admissions=args.admissions)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, Any] = {
        "command": "python -m bench.pod_attribution " + " ".join(shlex.quote(a) for a in argv),
        "started_utc": stamp,
        "mode": "quick" if args.quick else "full",
        "kubelet_release": args.kubelet,
        "bench_sizes": asdict(sizes),
        "machine": machine.describe(bench_binary(args.kubelet), gdp_binary()),
    }
    if gdp_missing():
        result["peer_missing"] = gdp_missing()
    started = time.monotonic()
    baseline = args.baseline.resolve() if args.baseline else None
    if baseline is not None:
        result["baseline"] = {"path": str(baseline), "git_revision": machine.git_revision(baseline)}
    bench = Bench(sizes, args.kubelet, baseline)
    try:
        bench.open()
        result.update(bench.run())
    finally:
        bench.close()
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["machine"]["loadavg_at_end"] = machine.loadavg()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    # A quick run's numbers mean nothing: its file is not one the docs quote.
    path = args.results_dir / f"{stamp}-pod-attribution{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
