"""The benchmark suite: every figure, for every peer that can do it.

Figures (keys of ``results["figures"]``), each ``{peer: {...}}``; a peer that cannot
produce a figure has ``{"na": "why"}`` instead of numbers:

1. ``allocate_kubelet_seq``: Allocate as the kubelet sees it (bench ``allocate_s``:
   the manager's Allocate, which makes the preferred-allocation and Allocate RPCs and
   writes the checkpoint), sequential pods. ``allocate_rpc_seq`` / ``allocate_rpc_conc``:
   the same RPCs from the kubelet's gRPC client straight at the plugin's socket, one
   caller and 16 concurrent callers (the kubelet itself admits one pod at a time).
2. ``kubelet_restart``: kubelet restart (process killed, new one started) until the
   resource is back at full allocatable.
3. ``device_loss`` / ``device_return``: device node removed / restored until the
   kubelet's allocatable follows. ``update_floor``: for reference, a health update pushed
   by the Go stub on command (no detection), the kubelet-side floor of any such figure.
4. ``cold_start``: process start until full allocatable at the kubelet.
5. ``memory``: resident memory after registration and after N allocations;
   ``memory_growth``: resident memory with 1, 10, 64 resources on one node (64: the
   most a config may list).
6. ``idle``: CPU seconds and context switches per minute while nothing happens.
7. ``metrics_scrape``: /metrics with the largest resource count of ``memory_growth``.
8. Next to squat/generic-device-plugin: ``admission_cpu`` (CPU seconds of the
   plugin per admission through the kubelet), ``allocate_rpc_scaling`` (throughput at the
   socket with 1..16 callers), ``restarts_then_changes`` (device changes the kubelet
   still sees after 12 kubelet restarts), ``idle`` of each peer fresh and after those
   restarts, with its resident memory.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import procstat
from bench.peers import BARE_PLUGIN, BARE_SYNC_PLUGIN, GDP, UNITS, BarePeer, DeviceNodes, Env, GoStub, gdp_missing
from bench.stats import summary_ms
from tests.harness.kubelet import BenchError, Namespace
from tests.harness.otlp import OtlpReceiver

log = logging.getLogger("bench")

MIB = 1024 * 1024


@dataclass(frozen=True)
class Sizes:
    """How much of everything one run does."""

    warmup: int = 50
    seq_pods: int = 2000
    block: int = 250  # sequential pods per peer before switching to the next (interleaving)
    window: int = 100  # active pods kept; older ones terminate (a node's pod count stays real)
    rpc_calls: int = 2000
    concurrency: int = 16
    restarts: int = 30
    stub_restarts: int = 10  # the Go stub takes a fixed 10 s each
    device_rounds: int = 30
    cold_starts: int = 20  # bimodal under load (the interpreter's start): 10 left the median to chance
    mem_allocs: int = 10_000
    mem_checkpoint: int = 1000  # "warm" reading, to tell growth from warm-up
    growth: tuple[int, ...] = (1, 10, 64)  # 64: the most resources a config may list
    idle_s: float = 60.0
    scrapes: int = 200
    # generic-device-plugin polls every 5 s and re-registers 5 s after a restart: fewer rounds.
    gdp_restarts: int = 10
    gdp_device_rounds: int = 10
    leak_restarts: int = 12  # kubelet restarts before the device changes of restarts_then_changes
    leak_changes: int = 3
    concurrency_levels: tuple[int, ...] = (1, 2, 4, 8, 16)


FULL = Sizes()
QUICK = Sizes(
    warmup=10,
    seq_pods=60,
    block=30,
    window=20,
    rpc_calls=160,
    restarts=2,
    stub_restarts=1,
    device_rounds=2,
    cold_starts=1,
    mem_allocs=200,
    mem_checkpoint=100,
    growth=(1, 2, 4),
    idle_s=5.0,
    scrapes=10,
    gdp_restarts=1,
    gdp_device_rounds=1,
    leak_restarts=2,
    leak_changes=1,
    concurrency_levels=(1, 2),
)

PEERS_ALLOCATE = ("ours", "go-stub", "go-stub-pref")
PEERS = ("ours", "go-stub")
GDP_FIGURES = (
    "allocate_kubelet_seq",
    "admission_cpu",
    "allocate_rpc_seq",
    "allocate_rpc_conc",
    "allocate_rpc_scaling",
    "kubelet_restart",
    "device_loss",
    "device_return",
    "restarts_then_changes",
    "idle",
    "cold_start",
)
# A change the generic-device-plugin has not passed on within this long is not coming:
# it looks every 5 s.
GDP_CHANGE_TIMEOUT_S = 15.0


IDLE_WINDOW_S = 10.0


def _merge_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for name, n in c.items():
            out[name] = out.get(name, 0) + n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _na(why: str) -> dict[str, Any]:
    return {"na": why}


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class Suite:
    def __init__(self, version: str, sizes: Sizes, work_root: Path | None = None) -> None:
        self.version = version
        self.sizes = sizes
        self.work_root = work_root
        self.figures: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, str] = {}
        self.load: dict[str, list[float]] = {}
        self.timings: dict[str, float] = {}
        self.gdp_missing = gdp_missing()
        with_gdp = () if self.gdp_missing else (GDP,)
        # The bare plugin is the Python floor: allocation, cold start and idle only; its
        # twin on gRPC's sync server: allocation only.
        self.peers_allocate = (*PEERS_ALLOCATE, *with_gdp, BARE_PLUGIN, BARE_SYNC_PLUGIN)
        self.peers = (*PEERS, *with_gdp)

    # -- helpers -------------------------------------------------------------------

    def env(self, peer: str, **kwargs: Any) -> Env:
        return Env(peer, self.version, work_root=self.work_root, **kwargs)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        log.info("== %s", name)
        begin = time.monotonic()
        self.load[f"{name}:before"] = _loadavg()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - begin, 1)
            self.load[f"{name}:after"] = _loadavg()
            log.info("   %s took %.1fs", name, self.timings[name])

    def put(self, figure: str, peer: str, value: dict[str, Any]) -> None:
        self.figures.setdefault(figure, {})[peer] = value

    # -- run -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Every phase; a phase that fails ends the run, but what was measured is kept."""
        error = None
        try:
            self._run()
        except Exception as exc:
            log.exception("the run failed")
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return {
            "figures": self.figures,
            "notes": self.notes,
            "loadavg": self.load,
            "phase_seconds": self.timings,
            "sizes": asdict(self.sizes),
            "error": error,
        }

    def _run(self) -> None:
        with OtlpReceiver() as otlp:
            envs = {p: self.env(p) for p in self.peers_allocate}
            mem_envs: dict[str, Env] = {}
            leak_envs: dict[str, Env] = {}
            floor: Env | None = None
            try:
                for e in envs.values():
                    e.open()
                with self.phase("allocate"):
                    self.allocate_kubelet(envs)
                    self.allocate_rpc(envs)
                envs.pop("go-stub-pref").close()
                envs.pop(BARE_SYNC_PLUGIN).close()
                # Kept for the idle figure: it never registers again after a kubelet restart.
                floor = envs.pop(BARE_PLUGIN)
                # Device changes and restarts run on an empty node, then with `window` pods
                # holding a unit: the kubelet's own handling of every device update grows
                # with those pods. Device changes come before restarts: after a kubelet
                # restart the Go stub's old ListAndWatch loops live on and take health
                # updates meant for the new stream. Releasing pods does not rewrite the
                # kubelet's checkpoint (the next device update does), so the empty-node
                # restarts follow the empty-node device changes.
                with self.phase("empty_node"):
                    self.set_pods(envs.values(), 0)
                    # The generic-device-plugin's changes take seconds: with pods only.
                    self.device_change({k: e for k, e in envs.items() if k != GDP}, suffix="_empty")
                    # The Go stub's restart takes its fixed 10 s either way: with pods only.
                    self.kubelet_restart({"ours": envs["ours"]}, suffix="_empty")
                with self.phase("with_pods"):
                    self.set_pods(envs.values(), self.sizes.window)
                    self.device_change(envs)
                    self.kubelet_restart(envs)
                with self.phase("restarts_then_changes"):
                    leak_envs = {p: self.env(p) for p in ("ours", GDP) if p in self.peers}
                    for e in leak_envs.values():
                        e.open()
                    self.restarts_then_changes(leak_envs)
                with self.phase("memory"):
                    mem_envs = {
                        "ours": self.env("ours", otlp_endpoint=otlp.endpoint),
                        "go-stub": self.env("go-stub"),
                    }
                    if GDP in self.peers:
                        mem_envs[GDP] = self.env(GDP)
                    fresh = {"ours-fresh": self.env("ours")}
                    if GDP in self.peers:
                        fresh["gdp-fresh"] = self.env(GDP)
                    mem_envs.update(fresh)
                    for e in mem_envs.values():
                        e.open()
                    self.memory({k: e for k, e in mem_envs.items() if k not in fresh})
                    self.figures["memory"]["ours"]["spans_received"] = len(otlp.spans)
                with self.phase("idle"):
                    # Fresh peers (registered, no kubelet restart yet, tracing off for ours),
                    # and the same after the kubelet restarts of restarts_then_changes.
                    subjects = {
                        "ours": mem_envs["ours-fresh"].p.pids,
                        "ours-tracing": mem_envs["ours"].p.pids,
                        "go-stub": envs["go-stub"].p.pids,
                    }
                    if "gdp-fresh" in mem_envs:
                        subjects[GDP] = mem_envs["gdp-fresh"].p.pids
                    for key, e in leak_envs.items():
                        subjects[f"{key}-restarted"] = e.p.pids
                    if floor is not None:
                        subjects[BARE_PLUGIN] = floor.p.pids
                    self.idle(subjects)
            finally:
                for e in [*envs.values(), *mem_envs.values(), *leak_envs.values(), *([floor] if floor else [])]:
                    e.close()
            with self.phase("cold_start"):
                self.cold_start()
            with self.phase("growth"):
                self.growth(otlp.endpoint)
        if self.gdp_missing:
            for figure in GDP_FIGURES:
                self.put(figure, GDP, _na(f"squat/generic-device-plugin not run: {self.gdp_missing}"))

    @staticmethod
    def set_pods(envs: Iterable[Env], count: int) -> None:
        """Leave exactly ``count`` active pods, each holding one unit of the peer's resource."""
        for e in envs:
            e.k.set_active_pods([])
            for i in range(count):
                e.k.allocate(f"held-{i}", "main", {e.p.resource: 1})

    # -- 1. allocate ---------------------------------------------------------------

    def allocate_kubelet(self, envs: dict[str, Env]) -> None:
        """Sequential admissions through each peer's kubelet, interleaved in blocks."""
        s = self.sizes
        samples: dict[str, list[float]] = {p: [] for p in envs}
        cpu: dict[str, float] = dict.fromkeys(envs, 0.0)
        counters = dict.fromkeys(envs, 0)

        def admit(e: Env, n: int) -> list[float]:
            out = []
            for _ in range(n):
                i = counters[e.peer_key]
                counters[e.peer_key] += 1
                a = e.k.allocate(f"pod-{i}", "main", {e.p.resource: 1})
                assert a.allocate_s is not None
                out.append(a.allocate_s)
                if i >= s.window:
                    e.k.remove_pod(f"pod-{i - s.window}")
            return out

        for e in envs.values():
            admit(e, s.warmup)
        done = 0
        while done < s.seq_pods:
            n = min(s.block, s.seq_pods - done)
            for key, e in envs.items():
                before = sum(procstat.cpu_seconds(pid) for pid in e.p.pids)
                samples[key] += admit(e, n)
                cpu[key] += sum(procstat.cpu_seconds(pid) for pid in e.p.pids) - before
            done += n
        for key, e in envs.items():
            value = summary_ms(samples[key])
            alloc = e.k.metrics()["alloc_duration"].get(e.p.resource, {})
            if alloc.get("count"):
                # The kubelet's own histogram: the Allocate RPC alone, without the preferred call.
                value["kubelet_alloc_rpc_mean_ms"] = alloc["sum"] / alloc["count"] * 1000
            self.put("allocate_kubelet_seq", key, value)
            self.put(
                "admission_cpu",
                key,
                {"cpu_ms_per_admission": cpu[key] * 1000 / len(samples[key]), "admissions": len(samples[key])},
            )
        self.notes["admission_cpu"] = (
            "utime + stime of the plugin's process(es) (/proc/<pid>/stat, 10 ms ticks) over the "
            "sequential admissions through the kubelet, divided by their number; the pods that "
            "end meanwhile cost the plugin nothing. The preferring stub gets two RPCs per "
            "admission (GetPreferredAllocation with every free unit, then Allocate); every other "
            "peer, ours included (GetPreferredAllocation is opt-in per resource), gets Allocate only."
        )

    def rpc_load(self, e: Env, count: int, concurrency: int, ids: list[str]) -> dict[str, Any]:
        r = e.k.request(
            "rpc_load",
            socket=e.p.socket,
            device_ids=ids,
            count=count,
            concurrency=concurrency,
            timeout_s=600.0,
            timeout=660.0,
        )
        value = summary_ms(r["latencies_s"])
        value.update(
            wall_s=r["wall_s"],
            calls_per_s=count / r["wall_s"],
            errors=r["errors"],
            first_error=r["first_error"],
            preferred_rpc=r["preferred"],
            concurrency=concurrency,
        )
        return value

    def allocate_rpc(self, envs: dict[str, Env]) -> None:
        s = self.sizes
        for key, e in envs.items():
            ids = e.k.allocatable_devices()[e.p.resource]
            try:
                self.rpc_load(e, 20, 1, ids)  # warm-up, and: does the bench know rpc_load?
            except Exception as exc:
                why = f"kubelet bench without rpc_load (rebuild with tools/build-kubelet-bench.sh): {exc}"
                self.put("allocate_rpc_seq", key, _na(why))
                self.put("allocate_rpc_conc", key, _na(why))
                continue
            self.put("allocate_rpc_seq", key, self.rpc_load(e, s.rpc_calls, 1, ids))
            self.put("allocate_rpc_conc", key, self.rpc_load(e, s.rpc_calls, s.concurrency, ids))
            scaling: dict[str, Any] = {}
            for callers in s.concurrency_levels:
                r = self.rpc_load(e, s.rpc_calls, callers, ids)
                scaling[str(callers)] = {k: r[k] for k in ("calls_per_s", "p50_ms", "p99_ms", "errors")}
            self.put("allocate_rpc_scaling", key, {"callers": scaling})
        self.notes["allocate_rpc_scaling"] = (
            f"{s.rpc_calls} admissions' worth of RPCs at the plugin's socket (GetPreferredAllocation "
            "then Allocate when the plugin advertises the former) from 1..16 goroutines sharing one "
            "connection, as the kubelet's client; throughput = calls / wall time."
        )

    # -- 2. kubelet restart ---------------------------------------------------------

    @staticmethod
    def restart_once(e: Env, timeout: float) -> tuple[float, float]:
        """Kill the kubelet, start a new one; (seconds until full again, seconds Start took)."""
        k = e.k
        pods = k.pods()
        k.kill()
        k.launch()
        t0 = time.monotonic_ns()
        k.start(pods)
        started = time.monotonic_ns()
        w = k.wait(e.p.resource, capacity=e.p.units, allocatable=e.p.units, timeout=timeout)
        return (w.done_monotonic_ns - t0) / 1e9, (started - t0) / 1e9

    def kubelet_restart(self, envs: dict[str, Env], suffix: str = "") -> None:
        s = self.sizes
        samples: dict[str, list[float]] = {p: [] for p in envs}
        start_s: dict[str, list[float]] = {p: [] for p in envs}
        for i in range(max(s.restarts, s.stub_restarts)):
            for key, e in envs.items():
                wanted = {"ours": s.restarts, GDP: s.gdp_restarts}.get(key, s.stub_restarts)
                if i >= wanted:
                    continue
                took, start = self.restart_once(e, timeout=60.0)
                samples[key].append(took)
                start_s[key].append(start)
                time.sleep(0.2)
        for key in envs:
            value = summary_ms(samples[key])
            value["kubelet_start_median_ms"] = summary_ms(start_s[key]).get("median_ms")
            self.put("kubelet_restart" + suffix, key, value)
        self.notes["kubelet_restart"] = (
            "Timed from the new kubelet's Start request (it removes every plugin socket and "
            "listens on kubelet.sock) until GetCapacity shows full allocatable, on an empty node "
            f"(`_empty`, ours only) and with {self.sizes.window} pods holding a unit. The Go stub's "
            "restart watch waits a fixed 10 s before serving and registering again, so it is "
            "measured with pods only."
        )

    # -- 3. device loss and return --------------------------------------------------

    def device_change(self, envs: dict[str, Env], suffix: str = "") -> None:
        s = self.sizes
        for key, e in envs.items():
            plugin = e.p
            why = plugin.cannot_remove_devices()
            if why is not None or not isinstance(plugin, DeviceNodes):
                self.put("device_loss" + suffix, key, _na(why or "not supported"))
                self.put("device_return" + suffix, key, _na(why or "not supported"))
                continue
            loss: list[float] = []
            back: list[float] = []
            u = plugin.units
            rounds, timeout = (s.gdp_device_rounds, 30.0) if key == GDP else (s.device_rounds, 10.0)
            for _ in range(rounds):
                # Ours marks the units unhealthy; the generic-device-plugin drops them.
                pending = e.k.begin_wait(plugin.resource, allocatable=0, timeout=timeout)
                t0 = time.monotonic_ns()
                plugin.remove_node()
                loss.append((pending.result().done_monotonic_ns - t0) / 1e9)
                pending = e.k.begin_wait(plugin.resource, capacity=u, allocatable=u, timeout=timeout)
                t0 = time.monotonic_ns()
                plugin.restore_node()
                back.append((pending.result().done_monotonic_ns - t0) / 1e9)
                time.sleep(0.05)
            self.put("device_loss" + suffix, key, summary_ms(loss))
            self.put("device_return" + suffix, key, summary_ms(back))
        stub_env = envs.get("go-stub")
        if stub_env is not None:
            self.put("update_floor" + suffix, "go-stub", self.update_floor(stub_env))

    def update_floor(self, e: Env) -> dict[str, Any]:
        """The Go stub pushes an all-unhealthy (then all-healthy) update on command."""
        assert isinstance(e.p, GoStub)
        stub = e.p.stubs[0]
        ids = stub.device_ids
        u = e.p.units
        samples: list[float] = []
        for _ in range(self.sizes.device_rounds):
            for unhealthy, allocatable in ((ids, 0), ([], u)):
                pending = e.k.begin_wait(e.p.resource, capacity=u, allocatable=allocatable, timeout=10)
                t0 = time.monotonic_ns()
                stub.set_health(unhealthy=unhealthy)
                samples.append((pending.result().done_monotonic_ns - t0) / 1e9)
        return summary_ms(samples)

    def restarts_then_changes(self, envs: dict[str, Env]) -> None:
        """``leak_restarts`` kubelet restarts on an empty node, then ``leak_changes`` device
        removals (each restored afterwards): how many of them reach the kubelet at all."""
        s = self.sizes
        for key, e in envs.items():
            plugin = e.p
            assert isinstance(plugin, DeviceNodes)
            restarts = [self.restart_once(e, timeout=60.0)[0] for _ in range(s.leak_restarts)]
            timeout = GDP_CHANGE_TIMEOUT_S if key == GDP else 5.0
            seen: list[float | None] = []
            for _ in range(s.leak_changes):
                for change, allocatable in ((plugin.remove_node, 0), (plugin.restore_node, plugin.units)):
                    pending = e.k.begin_wait(plugin.resource, allocatable=allocatable, timeout=timeout)
                    t0 = time.monotonic_ns()
                    change()
                    try:
                        took: float | None = (pending.result().done_monotonic_ns - t0) / 1e9
                    except TimeoutError:
                        took = None
                    if allocatable == 0:
                        seen.append(took)
                    elif took is None:
                        # The return was not seen either: the next removal would look unseen
                        # for that reason alone. Wait for it as long as it takes.
                        e.k.wait(plugin.resource, allocatable=plugin.units, timeout=120.0)
            self.put(
                "restarts_then_changes",
                key,
                {
                    "restarts": len(restarts),
                    "changes": len(seen),
                    "seen": sum(1 for t in seen if t is not None),
                    "timeout_s": timeout,
                    "seen_ms": [None if t is None else t * 1000 for t in seen],
                    "restart_median_ms": statistics.median(restarts) * 1000 if restarts else None,
                },
            )
        self.notes["restarts_then_changes"] = (
            f"A fresh plugin on an empty node; {s.leak_restarts} kubelet restarts (each until full "
            f"allocatable again), then {s.leak_changes} times: device node removed (seen = the "
            "kubelet's allocatable reaches 0 within the timeout, 5 s for ours, "
            f"{GDP_CHANGE_TIMEOUT_S:.0f} s = three of the generic-device-plugin's polling periods), "
            "then restored. The idle figure `-restarted` is these processes afterwards."
        )

    # -- 4. cold start --------------------------------------------------------------

    def cold_start(self) -> None:
        peers = (*self.peers, BARE_PLUGIN)
        samples: dict[str, list[float]] = {p: [] for p in peers}
        envs = {p: self.env(p) for p in peers}
        try:
            for e in envs.values():
                e.open(start_plugin=False)
            for _ in range(self.sizes.cold_starts):
                for key, e in envs.items():
                    plugin = e.p
                    u = plugin.units
                    pending = e.k.begin_wait(plugin.resource, capacity=u, allocatable=u, timeout=60)
                    t0 = time.monotonic_ns()
                    plugin.spawn()
                    samples[key].append((pending.result().done_monotonic_ns - t0) / 1e9)
                    plugin.started()
                    plugin.stop()
                    e.k.wait(plugin.resource, capacity=u, allocatable=0, timeout=30)
        finally:
            for e in envs.values():
                e.close()
        for key in peers:
            self.put("cold_start", key, summary_ms(samples[key]))
        self.notes["cold_start"] = (
            "From just before the process is spawned (through nsenter into the bench's mount "
            "namespace) until the kubelet shows full allocatable; the previous instance was "
            "stopped gracefully, so the kubelet keeps the capacity and only allocatable rises."
        )

    # -- 5. memory -------------------------------------------------------------------

    def memory(self, envs: dict[str, Env]) -> None:
        s = self.sizes
        for key, e in envs.items():
            time.sleep(1.0)
            pids = e.p.pids
            registered = procstat.total_rss_bytes(pids)
            series = [(0, registered)]
            warm = registered
            for i in range(s.mem_allocs):
                e.k.allocate(f"mem-{i}", "main", {e.p.resource: 1})
                if i >= s.window:
                    e.k.remove_pod(f"mem-{i - s.window}")
                n = i + 1
                if n % max(1, s.mem_allocs // 20) == 0 or n == s.mem_checkpoint:
                    rss = procstat.total_rss_bytes(pids)
                    series.append((n, rss))
                    if n == s.mem_checkpoint:
                        warm = rss
            time.sleep(1.0)
            after = procstat.total_rss_bytes(pids)
            series.append((s.mem_allocs, after))
            # Flat = the envelope does not rise: the peak over the second half of the
            # allocations against the peak over the first half after warm-up (span and
            # allocator buffers fill and drain, so single readings swing by a few MiB).
            mid = (s.mem_checkpoint + s.mem_allocs) // 2
            first = [b for n, b in series if s.mem_checkpoint <= n <= mid] or [warm]
            second = [b for n, b in series if n > mid] or [after]
            self.put(
                "memory",
                key,
                {
                    "rss_registered_mib": registered / MIB,
                    "rss_after_allocs_mib": after / MIB,
                    "rss_warm_mib": warm / MIB,
                    "allocations": s.mem_allocs,
                    "warm_at": s.mem_checkpoint,
                    "growth_after_warm_mib": (after - warm) / MIB,
                    "peak_growth_mib": (max(second) - max(first)) / MIB,
                    "pss_after_allocs_mib": sum(procstat.pss_bytes(p) or 0 for p in pids) / MIB,
                    "tracing": key == "ours",
                    "series": [[n, b / MIB] for n, b in series],
                },
            )
        self.notes["memory"] = (
            "VmRSS of the plugin's process(es). Ours runs with tracing on (OTLP/gRPC to a local "
            "receiver, every RPC traced). Allocations go through the kubelet; at most "
            f"{s.window} pods are active at a time (older ones terminate)."
        )

    def growth(self, otlp_endpoint: str) -> None:
        s = self.sizes
        results: dict[str, dict[str, Any]] = {p: {"resources": {}} for p in PEERS}
        failed: dict[str, str] = {}
        for n in s.growth:
            for key in PEERS:
                if key in failed:
                    continue
                extra: dict[str, Any] = {"otlp_endpoint": otlp_endpoint} if key == "ours" else {}
                try:
                    with self.env(key, resources=n, **extra) as e:
                        time.sleep(1.0)
                        rss = procstat.total_rss_bytes(e.p.pids)
                        results[key]["resources"][str(n)] = {"rss_mib": rss / MIB, "processes": len(e.p.pids)}
                        if n == max(s.growth):
                            why = e.p.cannot_scrape_metrics()
                            self.put("metrics_scrape", key, _na(why) if why else self.scrape(e, n))
                except BenchError as exc:
                    # E.g. 100 Go stub processes need 100 inotify instances, and the machine's
                    # per-user limit (fs.inotify.max_user_instances) is shared with others.
                    failed[key] = f"could not start {n} resources: {str(exc).splitlines()[0]}"
                    log.warning("growth: %s: %s", key, failed[key])
        lo, hi = min(s.growth), max(s.growth)
        for key in PEERS:
            if key in failed:
                self.put("memory_growth", key, _na(failed[key]))
                self.figures.setdefault("metrics_scrape", {}).setdefault(key, _na(failed[key]))
                continue
            by_n = results[key]["resources"]
            results[key]["per_extra_resource_mib"] = (by_n[str(hi)]["rss_mib"] - by_n[str(lo)]["rss_mib"]) / (hi - lo)
            results[key]["units_per_resource"] = UNITS
            self.put("memory_growth", key, results[key])
        self.notes["memory_growth"] = (
            f"Each resource advertises {UNITS} units. Ours serves every resource from one process "
            "(tracing on); the Go stub serves one resource per process, so its figure is the sum "
            "over its processes."
        )

    # -- 6. idle ---------------------------------------------------------------------

    def idle(self, pids: dict[str, list[int]]) -> None:
        """Every subject in the same windows; the figure is the median window (gRPC core's
        own worker threads wake in bursts, so one long window swings from run to run)."""
        windows = max(1, round(self.sizes.idle_s / IDLE_WINDOW_S))
        length = self.sizes.idle_s / windows
        per_window: dict[str, list[tuple[float, procstat.IdleCost]]] = {}
        rss: dict[str, int] = {}
        with Namespace() as ns:
            bares = [BarePeer(ns).start(), BarePeer(ns, held_stream=True).start()]
            try:
                subjects = {**pids, **{b.key: b.pids for b in bares}}
                time.sleep(2.0)  # let start-up work finish
                for _ in range(windows):
                    before = {k: [procstat.Snapshot.take(p) for p in v] for k, v in subjects.items()}
                    t0 = time.monotonic()
                    time.sleep(length)
                    seconds = time.monotonic() - t0
                    after = {k: [procstat.Snapshot.take(p) for p in v] for k, v in subjects.items()}
                    rss = {k: procstat.total_rss_bytes(v) for k, v in subjects.items()}
                    for key in subjects:
                        costs = [
                            procstat.idle_cost(b, a, seconds) for b, a in zip(before[key], after[key], strict=True)
                        ]
                        merged = procstat.IdleCost(
                            seconds=seconds,
                            cpu_s=sum(c.cpu_s for c in costs),
                            switches=sum(c.switches for c in costs),
                            by_thread=_merge_counts(c.by_thread for c in costs),
                            threads=sum(c.threads for c in costs),
                        )
                        per_window.setdefault(key, []).append((seconds, merged))
            finally:
                for b in bares:
                    b.stop()
        for key, measured in per_window.items():
            seconds = sum(sec for sec, _ in measured)
            costs = [c for _, c in measured]
            by_thread = _merge_counts(c.by_thread for c in costs)
            rates = [c.switches_per_s for c in costs]
            self.put(
                "idle",
                key,
                {
                    "seconds": seconds,
                    "windows": len(costs),
                    "cpu_s_per_min": sum(c.cpu_s for c in costs) * 60 / seconds,
                    "switches_per_s": statistics.median(rates),
                    "switches_per_min": statistics.median(rates) * 60,
                    "switches_per_s_windows": [round(r, 3) for r in rates],
                    "switches_per_s_mean": sum(c.switches for c in costs) / seconds,
                    # Python names no OS threads: "python" threads are the daemon's own code
                    # (event loop, inotify, HTTP); the rest belong to gRPC core or Go's runtime.
                    "own_switches_per_min": by_thread.get("python", 0) * 60 / seconds,
                    "threads": costs[-1].threads,
                    "switches_by_thread": by_thread,
                    "rss_mib": rss.get(key, 0) / MIB,
                },
            )
        self.notes["idle"] = (
            "Registered, ListAndWatch stream open, no requests; every plugin measured in the same "
            f"{windows} windows of {length:.0f} s, figure = the median window. CPU from /proc/<pid>/stat "
            "(utime+stime), context switches summed over /proc/<pid>/task/*/status "
            "(voluntary + nonvoluntary)."
        )

    # -- 7. /metrics -----------------------------------------------------------------

    def scrape(self, e: Env, resources: int) -> dict[str, Any]:
        port = e.p.metrics_port()
        assert port is not None
        variants = {
            "plain": {},
            "prometheus": {
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                "Accept-Encoding": "gzip",
            },
        }
        out: dict[str, Any] = {"resources": resources}
        for name, headers in variants.items():
            samples: list[float] = []
            size = 0
            for _ in range(self.sizes.scrapes + 3):
                t0 = time.perf_counter()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/metrics", headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                samples.append(time.perf_counter() - t0)
                size = len(body)
                if resp.status != 200:
                    raise RuntimeError(f"/metrics answered {resp.status}")
            value = summary_ms(samples[3:])
            value["bytes"] = size
            out[name] = value
        out["p50_ms"] = out["prometheus"]["p50_ms"]
        out["p99_ms"] = out["prometheus"]["p99_ms"]
        return out


def run_suite(version: str, sizes: Sizes, work_root: Path | None = None) -> dict[str, Any]:
    return Suite(version, sizes, work_root).run()
