"""The DRA path, ours next to kubernetes-sigs/dra-example-driver, through the same kubelet code.

One real API server (:mod:`bench.controlplane`) holds both drivers' nodes, slices and
claims. Each driver has its own node, its own directories and its own kubelet side:
``kubelet-bench dra`` (tests/kubelet_bench/dra.go), which links the kubelet's DRA
manager and plugin manager (``k8s.io/kubernetes/pkg/kubelet/cm/dra``,
``pkg/kubelet/pluginmanager``) of a pinned release and registers the driver through the
kubelet's own plugin watcher. The bench plays the scheduler: it writes each claim's
allocation (one published device) and reservation, as the scheduler leaves them.

Figures, per driver (rounds interleaved between the two):

* ``cold_start``: driver spawned → registered with the kubelet, and → its slices
  published. The kubelet's plugin manager reconciles every second, which bounds the first.
* ``prepare`` / ``unprepare``: PrepareResources / UnprepareResources of one pod with one
  claim through the kubelet's manager (its claim GET, the NodePrepareResources call, its
  checkpoint), p50/p99; and the kubelet's own gRPC histogram of the call alone.
* ``kubelet_restart``: the kubelet bench killed and started again (it deletes the node's
  slices at start, as a kubelet does) → driver registered again, → slices back.
* ``idle``: the driver's CPU, context switches and RSS while registered and published.
* ``kubelet_side``: the kubelet bench's Go heap and checkpoint with the driver's devices
  published and with ``held`` claims prepared: what DRA costs the kubelet per claim
  (there is no per-unit state on the kubelet's side).

The example driver runs from a binary given by ``--dra-example-driver PATH``, built
elsewhere from its public source (nothing of it is in this repository). Without one its
figures say why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from bench import controlplane, procstat
from bench.controlplane import ADMIN, ControlPlane
from bench.fleet import NULL
from bench.stats import summary_ms
from tests.e2e.sandbox import Process, children, die_with_parent
from tests.harness.apiserver import DRIVER_RULES
from tests.harness.devices import add_device_node
from tests.harness.kubelet import bench_binary, built_versions

log = logging.getLogger("bench")

MIB = 1024 * 1024
EXAMPLE_ENV = "ATE_BENCH_DRA_EXAMPLE_DRIVER"
OURS = "ours"
EXAMPLE = "dra-example-driver"
FLOOR = "bare-dra"
LABELS = {
    OURS: "ate-devplugin (Python)",
    EXAMPLE: "kubernetes-sigs/dra-example-driver (Go)",
    FLOOR: "bare grpc.aio + lightkube DRA driver (Python floor)",
}
DRIVERS = {OURS: "ate.dev", EXAMPLE: "gpu.example.com", FLOOR: "floor.bench"}
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEVICES = 32  # ours: --dra-slots default; the example: --num-devices set to match
NAMESPACE = "default"
EXAMPLE_RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
]  # fmt: skip


@dataclass(frozen=True)
class DraSizes:
    cold_starts: int = 5
    claims: int = 200
    block: int = 50
    restarts: int = 5
    idle_s: float = 60.0
    held: int = 32


DRA_FULL = DraSizes()
DRA_QUICK = DraSizes(cold_starts=1, claims=6, block=3, restarts=1, idle_s=5.0, held=4)


def example_binary() -> Path | None:
    value = os.environ.get(EXAMPLE_ENV, "")
    return Path(value) if value else None


def example_missing() -> str | None:
    path = example_binary()
    if path is None:
        return f"no binary given (--dra-example-driver PATH or {EXAMPLE_ENV})"
    if not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    return None


class DraKubelet:
    """``kubelet-bench dra`` in the sandbox: JSON lines on its stdin and stdout."""

    def __init__(self, cp: ControlPlane, release: str, node: str, root: Path) -> None:
        self.cp = cp
        self.argv = [
            str(bench_binary(release)), "dra", f"--kubeconfig={cp.kubeconfig(ADMIN)}", f"--node={node}",
            f"--registry-dir={root / 'reg'}", f"--state-dir={root / 'kubelet'}", "-v=1",
        ]  # fmt: skip
        self.log_path = root / "kubelet-bench-dra.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: queue.Queue[bytes] = queue.Queue()

    def start(self) -> int:
        """Starts the process; returns CLOCK_MONOTONIC ns just before the spawn."""
        enter = ["nsenter", "-t", str(self.cp.sandbox.init_pid), "-m", "-n", "-p", "--"]
        with self.log_path.open("ab") as log:
            t0 = time.monotonic_ns()
            self.proc = subprocess.Popen(
                [*enter, *self.argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        return t0

    @staticmethod
    def _pump(out: IO[bytes], lines: queue.Queue[bytes]) -> None:
        for line in out:
            lines.put(line)
        lines.put(b"")

    def request(self, cmd: str, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"kubelet-bench dra: no answer to {cmd} in {timeout:.0f}s") from None
        if not line:
            raise RuntimeError(f"kubelet-bench dra exited during {cmd}:\n{self.log_path.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"kubelet-bench dra {cmd}: {answer.get('error')}")
        return answer

    @property
    def pid(self) -> int:
        assert self.proc is not None
        kids = children(self.proc.pid)
        return kids[0] if kids else self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.request("exit", timeout=10)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


class Driver:
    """One DRA driver on its own node, with its own kubelet side."""

    def __init__(self, key: str, cp: ControlPlane, release: str, work: Path) -> None:
        self.key = key
        self.cp = cp
        self.node = f"dra-{key}"
        self.driver = DRIVERS[key]
        self.root = work / key
        # CDI specs on the sandbox's /run (tmpfs), as /var/run/cdi is on a node; the rest on disk.
        self.cdi = f"/run/bench-{key}-cdi"
        for d in ("reg", "plugins", "kubelet", "dev", "dp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        if key == OURS:
            add_device_node(self.root / "dev", "kvm", NULL)
        self.kubelet = DraKubelet(cp, release, self.node, self.root)
        self.proc: Process | None = None
        self.spawns = 0
        self.user = f"{key}:{self.node}"
        self.devices = DEVICES  # ours: and its shareable device where the API server keeps it

    @property
    def argv(self) -> list[str]:
        r = self.root
        if self.key == OURS:
            return [
                sys.executable, "-m", "ate_devplugin", "run", "--mode", "dra", "--node-name", self.node,
                "--device-root", str(r / "dev"), "--plugin-dir", str(r / "dp"),
                "--registry-dir", str(r / "reg"), "--dra-dir", str(r / "plugins" / self.driver),
                "--cdi-dir", self.cdi, "--metrics-address", "127.0.0.1:20900",
                "--log-format", "json", "--log-level", "info",
            ]  # fmt: skip
        if self.key == FLOOR:
            return [sys.executable, "-m", "bench.bare_dra", self.driver, self.node, str(r / "reg"),
                    str(r / "plugins"), str(DEVICES)]  # fmt: skip
        binary = example_binary()
        assert binary is not None
        return [
            str(binary), f"--node-name={self.node}", f"--cdi-root={self.cdi}", f"--num-devices={DEVICES}",
            f"--kubelet-registrar-directory-path={r / 'reg'}", f"--kubelet-plugins-directory-path={r / 'plugins'}",
            "--healthcheck-port=-1", "--metrics-port=-1",
        ]  # fmt: skip

    def spawn(self) -> int:
        """Starts the driver; CLOCK_MONOTONIC ns just before."""
        self.spawns += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATE_DEVPLUGIN_", "KUBE", "NODE_"))}
        env["KUBECONFIG"] = str(self.cp.kubeconfig(self.user))
        repo = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = os.pathsep.join([str(repo), str(repo / "app"), env.get("PYTHONPATH", "")])
        argv = self.argv
        self.cp.sandbox.run(["mkdir", "-p", self.cdi])
        t0 = time.monotonic_ns()
        self.proc = self.cp.sandbox.spawn(f"{self.key}-{self.spawns}", argv, env=env)
        return t0

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=20)
            self.cp.sandbox.processes.remove(self.proc)
            self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def clear_slices(self) -> None:
        """Deletes the driver's slices and waits until its kubelet side saw them go."""
        self.cp.must("DELETE", f"{SLICES}?fieldSelector=spec.driver%3D{self.driver}")
        deadline = time.monotonic() + 30
        while self.kubelet.request("slices", driver=self.driver)["devices"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.driver}: slices still seen 30 s after they were deleted")
            time.sleep(0.05)


def _ms(ns: int) -> float:
    return ns / 1e6


class DraPath:
    def __init__(self, sizes: DraSizes, release: str | None, work_root: Path | None = None) -> None:
        self.sizes = sizes
        dra_capable = [v for v in built_versions() if v != "1.29"]
        self.release = release if release in dra_capable else (dra_capable[-1] if dra_capable else None)
        self.work_root = work_root
        self.figures: dict[str, dict[str, Any]] = {}

    def put(self, figure: str, key: str, value: dict[str, Any]) -> None:
        self.figures.setdefault(figure, {})[key] = value

    def run(self) -> dict[str, Any]:
        why = controlplane.missing() or (None if self.release else "no kubelet bench of 1.35 or newer built")
        if why:
            return {"na": why}
        assert self.release is not None
        keys = [OURS, *([] if example_missing() else [EXAMPLE]), FLOOR]
        work = Path(tempfile.mkdtemp(prefix="bdra-", dir=self.work_root or "/tmp"))
        cp = ControlPlane(work)
        drivers: dict[str, Driver] = {}
        out: dict[str, Any] = {"sizes": asdict(self.sizes), "kubelet_release": self.release, "figures": self.figures}
        try:
            for key in keys:
                drivers[key] = Driver(key, cp, self.release, work)
                cp.add_user(drivers[key].user, key)
            cp.up()
            cp.apply_rbac("bench-ours", OURS, DRIVER_RULES)
            cp.apply_rbac("bench-example", EXAMPLE, EXAMPLE_RULES)
            cp.apply_rbac("bench-floor", FLOOR, DRIVER_RULES)
            out["apiserver_version"] = version = str(cp.must("GET", "/version").get("gitVersion"))
            drivers[OURS].devices += controlplane.keeps_shared_devices(version)
            for d in drivers.values():
                cp.create_node(d.node)
                d.kubelet.start()
            self.kubelet_floor(drivers)
            self.cold_start(drivers)
            for d in drivers.values():  # running from here on
                d.spawn()
                d.kubelet.request("wait_registered", driver=d.driver, timeout_s=60.0, timeout=90)
                d.kubelet.request("wait_slices", driver=d.driver, devices=d.devices, timeout_s=60.0, timeout=90)
            self.idle(drivers)
            self.prepare(drivers)
            # The floor never writes its slice again, so it has no figure after a kubelet restart.
            real = {k: d for k, d in drivers.items() if k != FLOOR}
            self.kubelet_side(real)
            self.kubelet_restart(real)
        except Exception as exc:
            log.exception("DRA path bench failed")
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            for d in drivers.values():
                with contextlib.suppress(Exception):
                    d.stop()
                d.kubelet.close()
            cp.close()
            shutil.rmtree(work, ignore_errors=True)
        why_not = example_missing()
        for figure in self.figures:
            if why_not:
                self.put(figure, EXAMPLE, {"na": f"kubernetes-sigs/dra-example-driver not run: {why_not}"})
            if FLOOR in drivers and FLOOR not in self.figures[figure]:
                self.put(figure, FLOOR, {"na": "the floor writes its slice once and keeps no kubelet-side state"})
        return out

    # --- figures --------------------------------------------------------------------

    def kubelet_floor(self, drivers: dict[str, Driver]) -> None:
        for key, d in drivers.items():
            m = d.kubelet.request("memstats", gc=True)
            self.put("kubelet_side", key, {"floor_heap_mib": m["heap_alloc"] / MIB, "floor_rss_mib": m["vm_rss"] / MIB})

    def cold_start(self, drivers: dict[str, Driver]) -> None:
        registered: dict[str, list[float]] = {k: [] for k in drivers}
        published: dict[str, list[float]] = {k: [] for k in drivers}
        for _ in range(self.sizes.cold_starts):
            for key, d in drivers.items():
                d.clear_slices()  # published = written by this start
                t0 = d.spawn()
                r = d.kubelet.request("wait_registered", driver=d.driver, timeout_s=60.0, timeout=90)
                registered[key].append((r["done_monotonic_ns"] - t0) / 1e9)
                r = d.kubelet.request("wait_slices", driver=d.driver, devices=d.devices, timeout_s=90.0, timeout=120)
                published[key].append((r["done_monotonic_ns"] - t0) / 1e9)
                d.stop()
                time.sleep(1.0)
        for d in drivers.values():
            d.clear_slices()
        for key in drivers:
            self.put("cold_start_registered", key, summary_ms(registered[key]))
            self.put("cold_start_published", key, summary_ms(published[key]))

    def prepare(self, drivers: dict[str, Driver]) -> None:
        s = self.sizes
        prepared: dict[str, list[float]] = {k: [] for k in drivers}
        unprepared: dict[str, list[float]] = {k: [] for k in drivers}
        cpu: dict[str, float] = dict.fromkeys(drivers, 0.0)
        cdi: dict[str, list[str]] = {}
        done = 0
        while done < s.claims:
            n = min(s.block, s.claims - done)
            for key, d in drivers.items():
                claims = d.kubelet.request(
                    "make_claims", namespace=NAMESPACE, driver=d.driver, count=n, prefix=f"{key}-{done}", timeout=120
                )["claims"]
                before = procstat.cpu_seconds(d.pid)
                for c in claims:
                    pod = {"namespace": NAMESPACE, "pod_name": c["pod_name"], "pod_uid": c["pod_uid"],
                           "claims": [c["claim"]]}  # fmt: skip
                    r = d.kubelet.request("prepare", **pod)
                    prepared[key].append(r["prepare_s"])
                    cdi.setdefault(key, r["cdi_devices"])
                    unprepared[key].append(d.kubelet.request("unprepare", **pod)["unprepare_s"])
                cpu[key] += procstat.cpu_seconds(d.pid) - before
                d.kubelet.request("delete_claims", namespace=NAMESPACE, names=[c["claim"] for c in claims])
            done += n
        for key, d in drivers.items():
            value = summary_ms(prepared[key])
            grpc = d.kubelet.request("metrics")["grpc"]
            calls: dict[str, list[float]] = {}  # method -> [count, sum] over every status code
            for k, stat in grpc.items():
                driver, method, _code = k.split(" ")
                if driver == d.driver:
                    entry = calls.setdefault(method.rsplit("/", 1)[-1], [0.0, 0.0])
                    entry[0] += stat["count"]
                    entry[1] += stat["sum"]
            for method, (count, total) in calls.items():
                if count:
                    value[f"grpc_{method}_mean_ms"] = total / count * 1000
            value["cdi_devices"] = cdi.get(key, [])
            value["cpu_ms_per_claim"] = cpu[key] * 1000 / max(1, len(prepared[key]))
            self.put("prepare", key, value)
            self.put("unprepare", key, summary_ms(unprepared[key]))

    def kubelet_side(self, drivers: dict[str, Driver]) -> None:
        """The kubelet's DRA state with the driver's devices published, then ``held`` claims prepared."""
        for key, d in drivers.items():
            value = self.figures["kubelet_side"][key]
            state = d.root / "kubelet" / "dra_manager_state"
            m = d.kubelet.request("memstats", gc=True)
            value.update(published_heap_mib=m["heap_alloc"] / MIB, state_bytes_empty=_size(state))
            claims = d.kubelet.request(
                "make_claims", namespace=NAMESPACE, driver=d.driver, count=self.sizes.held, prefix=f"{key}-held",
                timeout=120,
            )["claims"]  # fmt: skip
            pods = [{"namespace": NAMESPACE, "pod_name": c["pod_name"], "pod_uid": c["pod_uid"],
                     "claims": [c["claim"]]} for c in claims]  # fmt: skip
            for pod in pods:
                d.kubelet.request("prepare", **pod)
            m = d.kubelet.request("memstats", gc=True)
            value.update(
                held=len(pods),
                held_heap_mib=m["heap_alloc"] / MIB,
                state_bytes_held=_size(state),
                state_bytes_per_claim=(_size(state) - value["state_bytes_empty"]) / len(pods),
                heap_kib_per_claim=(m["heap_alloc"] / MIB - value["published_heap_mib"]) * 1024 / len(pods),
            )
            for pod in pods:
                d.kubelet.request("unprepare", **pod)
            d.kubelet.request("delete_claims", namespace=NAMESPACE, names=[c["claim"] for c in claims])

    def kubelet_restart(self, drivers: dict[str, Driver]) -> None:
        registered: dict[str, list[float]] = {k: [] for k in drivers}
        back: dict[str, list[float]] = {k: [] for k in drivers}
        for _ in range(self.sizes.restarts):
            for key, d in drivers.items():
                d.kubelet.kill()
                t0 = d.kubelet.start()
                r = d.kubelet.request("wait_registered", driver=d.driver, timeout_s=60.0, timeout=90)
                registered[key].append((r["done_monotonic_ns"] - t0) / 1e9)
                r = d.kubelet.request("wait_slices", driver=d.driver, devices=d.devices, timeout_s=120.0, timeout=150)
                back[key].append((r["done_monotonic_ns"] - t0) / 1e9)
        for key in drivers:
            self.put("kubelet_restart_registered", key, summary_ms(registered[key]))
            self.put("kubelet_restart_slices", key, summary_ms(back[key]))

    def idle(self, drivers: dict[str, Driver]) -> None:
        time.sleep(3.0)
        before = {k: procstat.Snapshot.take(d.pid) for k, d in drivers.items()}
        t0 = time.monotonic()
        time.sleep(self.sizes.idle_s)
        seconds = time.monotonic() - t0
        for key, d in drivers.items():
            cost = procstat.idle_cost(before[key], procstat.Snapshot.take(d.pid), seconds)
            self.put("idle", key, {
                "seconds": seconds,
                "cpu_s_per_min": cost.cpu_s * 60 / seconds,
                "switches_per_s": cost.switches_per_s,
                "threads": cost.threads,
                "rss_mib": procstat.rss_bytes(d.pid) / MIB,
            })  # fmt: skip


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def run_dra_path(sizes: DraSizes, release: str | None, work_root: Path | None = None) -> dict[str, Any]:
    return DraPath(sizes, release, work_root).run()
