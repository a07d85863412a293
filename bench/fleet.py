"""The API server's cost of the DRA driver at fleet scale: N real daemons, one API server.

Each daemon is ``python -m ate_devplugin run --mode dra --node-name node-<i>`` with its
own device root (one ``kvm`` node), plugin, registry, DRA and CDI directories and its own
API identity (``ate-devplugin:node-<i>``, group ``ate-devplugin``, bound to the chart's
permissions), against one real kube-apiserver and etcd (:mod:`bench.controlplane`),
everything inside one private sandbox. No kubelet is needed to publish slices; each
node's Node object exists (the slices' owner). The API server's audit log tells who made
which request, its metrics say how many watches are held.

Per fleet size (nodes are added to the running fleet, so each size reuses the last):

* ``startup``: requests per node from spawn until every node's slices are published.
* ``idle``: requests per node per hour while nothing changes, by verb and resource;
  watches held per node (``apiserver_longrunning_requests``); API server and etcd memory.
* ``device_change``: API writes per device change (a node's device removed, then back).
* ``restart``: kube-apiserver stopped for ``down_s`` and started again: requests in the
  first ``storm_s`` after it is ready, when each node's watch is back, and the daemons'
  own retries while it was down (from their logs): how many, and how aligned in time.
* ``wipe``: every slice deleted at once: until every node's slices are back, writes per node.

Then a projection to 5,000 nodes from the per-node figures (linear: what one node costs,
times 5,000), next to the kubelet's own per-node load (:mod:`bench.kubelet_load`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import controlplane, kubelet_load, procstat
from bench.controlplane import ControlPlane
from bench.kubelet_load import RealKubelet
from tests.e2e.sandbox import Process
from tests.harness.apiserver import DRIVER_RULES
from tests.harness.devices import DeviceNumber, add_device_node

log = logging.getLogger("bench")

MIB = 1024 * 1024
PROJECT_TO = 5000
SLOTS = 32  # the daemon's default --dra-slots
GROUP = "ate-devplugin"
NULL = DeviceNumber(1, 3)
WRITES = ("create", "update", "patch", "delete", "deletecollection")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass(frozen=True)
class FleetSizes:
    nodes: tuple[int, ...] = (10, 50, 100)
    idle_s: float = 330.0  # longer than the daemon's 300 s watch timeout: each watch renews once
    change_nodes: int = 10
    changes: int = 3
    down_s: float = 10.0
    storm_s: float = 60.0
    mem_fraction: float = 0.4  # of MemAvailable the fleet may take (the machine is shared)
    kubelet_idle_s: float = 330.0


FLEET_FULL = FleetSizes()
FLEET_QUICK = FleetSizes(
    nodes=(3,), idle_s=15.0, change_nodes=2, changes=1, down_s=2.0, storm_s=10.0, kubelet_idle_s=15.0
)


def user(node: str) -> str:
    return f"{GROUP}:{node}"


@dataclass
class FleetNode:
    name: str
    root: Path
    port: int
    proc: Process | None = None

    @property
    def device_root(self) -> Path:
        return self.root / "dev"

    @property
    def log_path(self) -> Path:
        assert self.proc is not None
        return self.proc.log_path


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _log_times(path: Path, needle: str) -> list[float]:
    """Epoch times of the daemon's JSON log lines whose message contains ``needle``."""
    out = []
    with contextlib.suppress(OSError):
        for raw in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError, ValueError):
                entry = json.loads(raw)
                if needle in entry["msg"]:
                    out.append(datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp())
    return out


def _metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _by_verb_resource(events: Iterable[controlplane.AuditEvent]) -> dict[str, int]:
    counts = Counter(f"{e.verb} {e.resource}" for e in events)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass
class Fleet:
    cp: ControlPlane
    work: Path
    nodes: list[FleetNode] = field(default_factory=list)

    def prepare(self, count: int) -> None:
        """Identities for ``count`` nodes: before the API server starts (it reads tokens once)."""
        for i in range(count):
            self.cp.add_user(user(f"node-{i}"), GROUP)

    def grant(self) -> None:
        self.cp.apply_rbac("ate-devplugin-bench", GROUP, DRIVER_RULES)

    def add(self, count: int) -> list[FleetNode]:
        """Start ``count`` more daemons (Node objects first); returns them once started."""
        added = []
        for _ in range(count):
            i = len(self.nodes)
            node = FleetNode(f"node-{i}", self.work / f"n{i}", 20000 + i)
            for d in ("dev", "plugins", "reg", "dra", "cdi"):
                (node.root / d).mkdir(parents=True, exist_ok=True)
            add_device_node(node.device_root, "kvm", NULL)
            self.cp.create_node(node.name)
            self.nodes.append(node)
            added.append(node)
        repo = Path(__file__).resolve().parents[1]
        for node in added:
            r = node.root
            argv = [
                sys.executable, "-m", "ate_devplugin", "run", "--mode", "dra", "--node-name", node.name,
                "--device-root", str(node.device_root), "--plugin-dir", str(r / "plugins"),
                "--registry-dir", str(r / "reg"), "--dra-dir", str(r / "dra"), "--cdi-dir", str(r / "cdi"),
                "--metrics-address", f"127.0.0.1:{node.port}", "--log-format", "json", "--log-level", "info",
            ]  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATE_DEVPLUGIN_", "KUBE"))}
            env["KUBECONFIG"] = str(self.cp.kubeconfig(user(node.name)))
            env["PYTHONPATH"] = os.pathsep.join([str(repo / "app"), env.get("PYTHONPATH", "")])
            node.proc = self.cp.sandbox.spawn(f"daemon-{node.name}", argv, env=env)
        return added

    def slice_devices(self) -> dict[str, int]:
        """Devices published per node, as the API server holds them."""
        listing = self.cp.must("GET", SLICES)
        out: Counter[str] = Counter()
        for item in listing.get("items", []):
            spec = item.get("spec", {})
            if spec.get("driver") == "ate.dev":
                out[spec.get("nodeName", "")] += len(spec.get("devices") or [])
        return dict(out)

    def wait_devices(self, want: dict[str, int], timeout: float) -> float:
        """Until every named node publishes exactly its number of devices; time.time() then."""
        deadline = time.monotonic() + timeout
        while True:
            have = self.slice_devices()
            if all(have.get(n, 0) == d for n, d in want.items()):
                return time.time()
            for node in self.nodes:
                if node.name in want and node.proc is not None and not node.proc.running():
                    raise RuntimeError(f"{node.name} exited:\n{node.proc.log_tail()}")
            if time.monotonic() > deadline:
                missing = sorted(n for n, d in want.items() if have.get(n, 0) != d)
                raise TimeoutError(f"{len(missing)} nodes not at their devices after {timeout:.0f}s: {missing[:5]}")
            time.sleep(0.2)

    def users(self, nodes: Sequence[FleetNode] | None = None) -> set[str]:
        return {user(n.name) for n in (self.nodes if nodes is None else nodes)}

    def rss(self) -> list[int]:
        return [procstat.rss_bytes(n.proc.pid) for n in self.nodes if n.proc is not None and n.proc.running()]

    def close(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                node.proc.stop(timeout=10)


def _per_node_hour(count: int, nodes: int, seconds: float) -> float:
    return count / nodes * 3600.0 / seconds if nodes and seconds else 0.0


class FleetBench:
    def __init__(self, sizes: FleetSizes, work_root: Path | None = None) -> None:
        self.sizes = sizes
        self.work_root = work_root
        self.steps: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {}
        self.kubelet: RealKubelet | None = None
        self.kubelet_idle: list[tuple[float, float]] = []  # the idle windows the kubelet ran through
        self.kubelet_restarts: list[dict[str, Any]] = []
        self.devices_per_node = SLOTS  # and its shareable device where the API server keeps it

    def run(self) -> dict[str, Any]:
        why = controlplane.missing()
        if why:
            return {"na": why}
        work = Path(tempfile.mkdtemp(prefix="bfl-", dir=self.work_root or "/tmp"))
        cp = ControlPlane(work)
        fleet = Fleet(cp, work)
        result: dict[str, Any] = {"sizes": asdict(self.sizes), "steps": self.steps}
        try:
            fleet.prepare(max(self.sizes.nodes))
            kubelet_missing = kubelet_load.missing()
            if not kubelet_missing:
                RealKubelet.prepare(cp)
            cp.up()
            fleet.grant()
            result["apiserver_version"] = version = str(cp.must("GET", "/version").get("gitVersion"))
            self.devices_per_node = SLOTS + controlplane.keeps_shared_devices(version)
            result["devices_per_node"] = self.devices_per_node
            result["kubelet"] = {"na": kubelet_missing} if kubelet_missing else self.start_kubelet(cp, work)
            planned = list(self.sizes.nodes)
            for n in planned:
                if n <= len(fleet.nodes):
                    continue
                if fleet.nodes:
                    per_daemon = statistics.mean(fleet.rss())
                    room = int(self.sizes.mem_fraction * _mem_available() / per_daemon) + len(fleet.nodes)
                    if n > room:
                        self.notes["capped"] = (
                            f"{n} daemons would not fit: {per_daemon / MIB:.0f} MiB each, "
                            f"{_mem_available() / MIB:.0f} MiB available; stopped at {len(fleet.nodes)}"
                        )
                        break
                self.steps.append(self.step(fleet, n))
            result["projection"] = self.projection()
            if self.kubelet is not None:
                result["kubelet"].update(self.kubelet_figures(cp))
        except Exception as exc:
            log.exception("fleet bench failed")
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            fleet.close()
            if self.kubelet is not None:
                self.kubelet.stop()
            cp.close()
            shutil.rmtree(work, ignore_errors=True)
        result["notes"] = self.notes
        return result

    # --- one fleet size -------------------------------------------------------------

    def step(self, fleet: Fleet, n: int) -> dict[str, Any]:
        cp = fleet.cp
        log.info("fleet: %d daemons", n)
        t0 = time.time()
        added = fleet.add(n - len(fleet.nodes))
        published = fleet.wait_devices(
            {x.name: self.devices_per_node for x in fleet.nodes}, timeout=120 + 6 * len(added)
        )
        time.sleep(2.0)
        startup = list(cp.requests(t0, time.time(), fleet.users(added)))
        creates = Counter(e.user for e in startup if e.verb == "create")
        out: dict[str, Any] = {
            "nodes": n,
            "startup": {
                "nodes_started": len(added),
                "seconds_to_published": published - t0,
                "requests_per_node": len(startup) / len(added),
                "by_verb_resource": _by_verb_resource(startup),
                # A node that created its slice twice published a duplicate pool for a while.
                "nodes_creating_twice": sum(1 for c in creates.values() if c > 1),
            },
        }
        out["idle"] = self.idle(fleet)
        out["device_change"] = self.device_change(fleet)
        out["restart"] = self.restart(fleet)
        out["wipe"] = self.wipe(fleet)
        rss = fleet.rss()
        out["daemon_rss_mib"] = {"mean": statistics.mean(rss) / MIB, "max": max(rss) / MIB}
        return out

    def idle(self, fleet: Fleet) -> dict[str, Any]:
        cp = fleet.cp
        n = len(fleet.nodes)
        time.sleep(2.0)
        before = {name: procstat.cpu_seconds(pid) for name, pid in cp.pids().items()}
        t0 = time.time()
        time.sleep(self.sizes.idle_s)
        t1 = time.time()
        self.kubelet_idle.append((t0, t1))
        text = cp.metrics_text()
        after = {name: procstat.cpu_seconds(pid) for name, pid in cp.pids().items()}
        events = list(cp.requests(t0, t1, fleet.users()))
        watches = _metric_sum(text, "apiserver_longrunning_requests", verb="WATCH", resource="resourceslices")
        audited = cp.open_watches(t1, fleet.users())
        etcd = cp.etcd_metrics_text()
        return {
            "seconds": t1 - t0,
            "requests_per_node_per_hour": _per_node_hour(len(events), n, t1 - t0),
            "by_verb_resource_per_node_per_hour": {
                k: _per_node_hour(v, n, t1 - t0) for k, v in _by_verb_resource(events).items()
            },
            "watches_resourceslices": watches,
            "watches_per_node": watches / n,
            "watches_open_audit_per_node": audited / n,
            "apiserver_rss_mib": procstat.rss_bytes(cp.pids()["kube-apiserver"]) / MIB,
            "etcd_rss_mib": procstat.rss_bytes(cp.pids()["etcd"]) / MIB,
            "apiserver_cpu_s_per_min": (after["kube-apiserver"] - before["kube-apiserver"]) * 60 / (t1 - t0),
            "etcd_db_bytes": _metric_sum(etcd, "etcd_mvcc_db_total_size_in_use_in_bytes"),
            "slices": len(cp.must("GET", SLICES).get("items", [])),
        }

    def device_change(self, fleet: Fleet) -> dict[str, Any]:
        """The first ``change_nodes`` nodes lose their device and get it back, together."""
        s = self.sizes
        chosen = fleet.nodes[: s.change_nodes]
        t0 = time.time()
        took = []
        for _ in range(s.changes):
            for present in (False, True):
                begin = time.time()
                for node in chosen:
                    if present:
                        add_device_node(node.device_root, "kvm", NULL)
                    else:
                        (node.device_root / "kvm").unlink()
                done = fleet.wait_devices({x.name: self.devices_per_node if present else 0 for x in chosen}, timeout=60)
                took.append(done - begin)
        time.sleep(2.0)
        events = list(fleet.cp.requests(t0, time.time(), fleet.users(chosen)))
        writes = [e for e in events if e.verb in WRITES]
        changes = 2 * s.changes * len(chosen)
        return {
            "nodes": len(chosen),
            "changes": changes,
            "writes_per_change": len(writes) / changes,
            "requests_per_change": len(events) / changes,
            "by_verb_resource": _by_verb_resource(events),
            "all_published_s": took,
        }

    def restart(self, fleet: Fleet) -> dict[str, Any]:
        s = self.sizes
        cp = fleet.cp
        n = len(fleet.nodes)
        stopping = time.time()
        stopped = cp.stop_apiserver()
        time.sleep(s.down_s)
        ready = cp.start_apiserver()
        time.sleep(s.storm_s)
        end = time.time()
        events = list(cp.requests(ready - 5.0, ready + s.storm_s, fleet.users()))
        if self.kubelet is not None:
            theirs = list(cp.requests(ready - 5.0, ready + s.storm_s, {kubelet_load.USER}))
            self.kubelet_restarts.append({"requests": len(theirs), "by_verb_resource": _by_verb_resource(theirs)})
        first: dict[str, float] = {}
        watch_back: dict[str, float] = {}
        for e in sorted(events, key=lambda e: e.at):
            first.setdefault(e.user, e.at)
            if e.verb == "watch" and e.resource == "resourceslices":
                watch_back.setdefault(e.user, e.at)
        offsets = sorted(t - ready for t in first.values())
        back = sorted(t - ready for t in watch_back.values())
        # The daemons' own retries while the API server was away (their warnings: "writing
        # resource slices failed, again in", "watching resource slices failed: ...; watching
        # again in").
        retries = {
            node.name: [t - stopping for t in _log_times(node.log_path, "again in") if stopping <= t <= end]
            for node in fleet.nodes
        }
        counts = [len(v) for v in retries.values()]
        depth = min(counts) if counts else 0
        spreads = [
            max(v[k] for v in retries.values()) - min(v[k] for v in retries.values()) for k in range(depth)
        ]  # the k-th retry of every node: how far apart (0 = all at once: no jitter)
        return {
            "down_s": ready - stopped,
            "failed_requests_first_window": sum(1 for e in events if e.code >= 400),
            "codes": dict(Counter(str(e.code) for e in events)),
            "stop_s": stopped - stopping,
            "requests_first_window": len(events),
            "requests_per_node_first_window": len(events) / n,
            "window_s": s.storm_s,
            "by_verb_resource": _by_verb_resource(events),
            "first_request_after_ready_s": {
                "min": offsets[0] if offsets else None,
                "max": offsets[-1] if offsets else None,
                "stdev": statistics.pstdev(offsets) if len(offsets) > 1 else 0.0,
            },
            "nodes_watching_again": len(back),
            "every_node_watching_s": back[-1] if len(back) == n else None,
            "retries_per_node": {
                "min": min(counts, default=0),
                "max": max(counts, default=0),
                "mean": statistics.mean(counts) if counts else 0.0,
            },
            "retry_spread_s": spreads,
            "retry_offsets_node0_s": retries.get("node-0", []),
        }

    def wipe(self, fleet: Fleet) -> dict[str, Any]:
        cp = fleet.cp
        t0 = time.time()
        cp.must("DELETE", SLICES)
        done = fleet.wait_devices({x.name: self.devices_per_node for x in fleet.nodes}, timeout=300)
        time.sleep(2.0)
        events = list(cp.requests(t0, time.time(), fleet.users()))
        writes = [e for e in events if e.verb in WRITES]
        return {
            "every_node_back_s": done - t0,
            "writes_per_node": len(writes) / len(fleet.nodes),
            "requests_per_node": len(events) / len(fleet.nodes),
            "by_verb_resource": _by_verb_resource(events),
        }

    # --- the kubelet's own load ------------------------------------------------------

    def start_kubelet(self, cp: ControlPlane, work: Path) -> dict[str, Any]:
        kubelet = RealKubelet(cp, work)
        try:
            began = time.time()
            up = kubelet.start()
        except RuntimeError as exc:
            kubelet.stop()
            return {"na": f"the kubelet did not come up: {str(exc).splitlines()[0]}"}
        self.kubelet = kubelet
        version = cp.must("GET", f"/api/v1/nodes/{kubelet_load.NODE}")["status"]["nodeInfo"]["kubeletVersion"]
        return {
            "source": f"a real kubelet {version} ({controlplane.bin_dir().relative_to(controlplane.REPO)}) "
            "on Debian's containerd, no pods, same API server",
            "start_s": up - began,
        }

    def kubelet_figures(self, cp: ControlPlane) -> dict[str, Any]:
        """The kubelet's requests in the fleet's idle windows and after each API server restart."""
        users = {kubelet_load.USER}
        events = [e for t0, t1 in self.kubelet_idle for e in cp.requests(t0, t1, users)]
        seconds = sum(t1 - t0 for t0, t1 in self.kubelet_idle)
        return {
            "idle_seconds": seconds,
            "requests_per_node_per_hour": _per_node_hour(len(events), 1, seconds),
            "by_verb_resource_per_node_per_hour": {
                k: _per_node_hour(v, 1, seconds) for k, v in _by_verb_resource(events).items()
            },
            "watches": cp.open_watches(self.kubelet_idle[-1][1], users) if self.kubelet_idle else None,
            "restarts": self.kubelet_restarts,
        }

    # --- 5,000 nodes ----------------------------------------------------------------

    def projection(self) -> dict[str, Any]:
        """Per-node figures of the largest fleet measured, times PROJECT_TO."""
        if not self.steps:
            return {}
        big = self.steps[-1]
        n = big["nodes"]
        out: dict[str, Any] = {"from_nodes": n, "nodes": PROJECT_TO}
        idle = big["idle"]
        out["idle_requests_per_s"] = idle["requests_per_node_per_hour"] * PROJECT_TO / 3600
        out["watches"] = idle["watches_per_node"] * PROJECT_TO
        out["startup_requests"] = big["startup"]["requests_per_node"] * PROJECT_TO
        r = big["restart"]
        out["restart_requests_first_window"] = r["requests_per_node_first_window"] * PROJECT_TO
        out["restart_requests_per_s_first_window"] = out["restart_requests_first_window"] / r["window_s"]
        out["wipe_writes"] = big["wipe"]["writes_per_node"] * PROJECT_TO
        if len(self.steps) >= 2:
            small = self.steps[0]
            dn = n - small["nodes"]
            if dn > 0:
                per = (idle["apiserver_rss_mib"] - small["idle"]["apiserver_rss_mib"]) / dn
                out["apiserver_mib_per_node"] = per
                out["apiserver_extra_mib"] = per * PROJECT_TO
                per_db = (idle["etcd_db_bytes"] - small["idle"]["etcd_db_bytes"]) / dn
                out["etcd_bytes_per_node"] = per_db
        return out
