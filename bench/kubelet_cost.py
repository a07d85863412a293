"""The kubelet's cost of our units: the device manager's side, as units and resources grow.

For each kubelet release, resource count and units per resource, a fresh namespace with
the kubelet's real device manager (tests/kubelet_bench) and our daemon serving that many
resources of that many units. Measured on the kubelet side:

* its resident memory and Go heap (``runtime.MemStats`` from inside the bench, live heap
  after a GC) once every resource is registered, and after the admissions;
* its CPU per admission (one unit of the first resource per pod, at most ``window`` pods
  active), from /proc, and per device list (a device node removed, then restored: the
  kubelet gets two full lists of every unit of that resource);
* the size of ``kubelet_internal_checkpoint``, which the manager rewrites whole at every
  admission and every device list (it holds every registered unit of every resource).

A kubelet bench with the manager started and no plugin gives the floor that each figure
is compared against (``*_over_floor``). Our daemon's own RSS is kept alongside.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import procstat
from bench.peers import DeviceNodes, Env
from tests.harness.kubelet import CHECKPOINT_FILE, PLUGIN_DIR, BenchError, built_versions

log = logging.getLogger("bench")

MIB = 1024 * 1024
MAX_TOTAL_UNITS = 262_144  # the config's limit over every resource


@dataclass(frozen=True)
class CostSizes:
    releases: tuple[str, ...] = ("1.35", "1.37")
    units: tuple[int, ...] = (110, 1024, 4096, 16384)
    resources: tuple[int, ...] = (1, 4, 16)
    admissions: int = 200
    window: int = 50
    lists: int = 3  # device removed + restored, each time two full lists


COST_FULL = CostSizes()
COST_QUICK = CostSizes(releases=(), units=(110, 1024), resources=(1, 2), admissions=10, window=5, lists=1)


def _memstats(env: Env) -> dict[str, float]:
    m = env.k.request("memstats", gc=True)
    return {
        "heap_live_mib": m["heap_alloc"] / MIB,
        "heap_objects": m["heap_objects"],
        "go_sys_mib": m["sys"] / MIB,
        "rss_mib": m["vm_rss"] / MIB,
    }


def _checkpoint_bytes(env: Env) -> int:
    path = env.ns.path(f"{PLUGIN_DIR}/{CHECKPOINT_FILE}")
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _kubelet_cpu(env: Env) -> float:
    """The bench process's CPU seconds (getrusage: finer than /proc's 10 ms ticks)."""
    return float(env.k.request("memstats")["cpu_s"])


class KubeletCost:
    def __init__(self, sizes: CostSizes, default_release: str, work_root: Path | None = None) -> None:
        self.sizes = sizes
        built = built_versions()
        wanted = sizes.releases or (default_release,)
        self.releases = [r for r in wanted if r in built]
        self.skipped = [r for r in wanted if r not in built]
        self.work_root = work_root

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sizes": asdict(self.sizes), "releases": {}, "skipped_releases": self.skipped}
        for release in self.releases:
            rows: list[dict[str, Any]] = []
            out["releases"][release] = {"floor": self.floor(release), "rows": rows}
            for resources in self.sizes.resources:
                for units in self.sizes.units:
                    if resources * units > MAX_TOTAL_UNITS:
                        continue
                    log.info("kubelet cost %s: %d resource(s) x %d units", release, resources, units)
                    try:
                        rows.append(self.one(release, resources, units))
                    except (BenchError, TimeoutError, RuntimeError) as exc:
                        rows.append({"resources": resources, "units": units, "na": str(exc).splitlines()[0]})
        return out

    def floor(self, release: str) -> dict[str, Any]:
        """The manager started, no plugin: what the bench process costs by itself."""
        env = Env("ours", release, work_root=self.work_root)
        try:
            env.open(start_plugin=False)
            time.sleep(1.0)
            return {**_memstats(env), "checkpoint_bytes": _checkpoint_bytes(env)}
        finally:
            env.close()

    def one(self, release: str, resources: int, units: int) -> dict[str, Any]:
        s = self.sizes
        env = Env("ours", release, resources=resources, units=units, work_root=self.work_root)
        try:
            env.open()
            time.sleep(1.0)
            registered = _memstats(env)
            row: dict[str, Any] = {
                "resources": resources,
                "units": units,
                "total_units": resources * units,
                "registered": registered,
                "checkpoint_bytes_registered": _checkpoint_bytes(env),
                "ours_rss_mib": procstat.total_rss_bytes(env.p.pids) / MIB,
            }
            first = env.p.resource
            cpu0 = _kubelet_cpu(env)
            t0 = time.monotonic()
            for i in range(s.admissions):
                env.k.allocate(f"cost-{i}", "main", {first: 1})
                if i >= s.window:
                    env.k.remove_pod(f"cost-{i - s.window}")
            row["admission_cpu_ms"] = (_kubelet_cpu(env) - cpu0) * 1000 / s.admissions
            row["admission_wall_ms"] = (time.monotonic() - t0) * 1000 / s.admissions
            row["checkpoint_bytes"] = _checkpoint_bytes(env)
            row["after_admissions"] = _memstats(env)
            row["list_cpu_ms"] = self.device_lists(env)
            return row
        finally:
            env.close()

    def device_lists(self, env: Env) -> float:
        """Kubelet CPU per full device list of one resource: from the change until the
        kubelet shows it (its GetCapacity polled every 10 ms, which costs it microseconds)."""
        plugin = env.p
        assert isinstance(plugin, DeviceNodes)
        resource, units = plugin.resource, plugin.units
        lists = 0
        cpu = 0.0
        for _ in range(self.sizes.lists):
            for change, allocatable in ((plugin.remove_node, 0), (plugin.restore_node, units)):
                time.sleep(0.2)
                before = _kubelet_cpu(env)
                change()
                env.k.wait(resource, allocatable=allocatable, timeout=30, interval=0.01)
                cpu += _kubelet_cpu(env) - before
                lists += 1
        return cpu * 1000 / lists


def run_kubelet_cost(sizes: CostSizes, default_release: str, work_root: Path | None = None) -> dict[str, Any]:
    return KubeletCost(sizes, default_release, work_root).run()
