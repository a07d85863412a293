"""``python -m bench.dra_faults [--app DIR] [--only NAME ...] --out FILE.json``: the DRA
driver under hostile input, with what it costs: RSS, the device-plugin side's Allocate
latency meanwhile (mode both), how long until things are right again.

Each scenario runs a fresh daemon (``--app`` picks the source tree it runs, default this
one, so the same scenarios measure another revision) against a real kube-apiserver +
etcd (tests/harness/apiserver.py), in mode both next to the kubelet's device manager
(tests/kubelet_bench) where the device-plugin side is measured. The test plays the
kubelet's DRA side: it calls the driver's sockets itself.

    prepare_flood      one NodePrepareResources of 10,000 allocated claims
    api_hangs          kube-apiserver paused (SIGSTOP): a prepare, then SIGTERM
    watch_ends         an API server whose every watch ends at once (a stub on loopback)
    foreign_slices     10,000 slices of our driver and node, not ours, there at start
    bad_names          claims named with / and ..
    registration_error NotifyRegistrationStatus(false) with a 1 MiB error, 5 times
    generation_max     a slice in our pool at generation 2^63-1, then a device change

Needs root, util-linux, the kubelet bench (1.35), build/k8s/1.35/kube-apiserver and etcd.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.harness import dra
from tests.harness.apiserver import ApiServer
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import make_device_root
from tests.harness.kubelet import KubeletBench, Namespace
from tests.harness.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
NODE = "bench-node"
KVM = "ate.dev/kvm"
FLOOD = 10_000


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """RSS peak of a process, sampled every 20 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.start = pid, 0.0, rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Allocations:
    """Allocate through the kubelet's device manager, one pod after another, on a thread;
    every call's latency and whether it answered the device."""

    def __init__(self, kubelet: KubeletBench) -> None:
        self.kubelet, self.ms, self.wrong, self.first_wrong = kubelet, list[float](), 0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            began = time.perf_counter()
            took: float | None = None
            try:
                alloc = self.kubelet.allocate(f"pod-{n}", "main", {KVM: 1}, timeout=30)
                ok = bool(alloc.devices or alloc.cdi_devices)
                took = alloc.allocate_s  # as the device manager timed it
            except Exception as exc:
                ok = False
                self.first_wrong = self.first_wrong or str(exc)[:300]
            self.ms.append(1000 * (took if took is not None else time.perf_counter() - began))
            self.wrong += not ok
            self.kubelet.remove_pod(f"pod-{n}")

    def __enter__(self) -> Allocations:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, Any]:
        if not self.ms:
            return {"calls": 0}
        return {"calls": len(self.ms), "wrong": self.wrong, "first_wrong": self.first_wrong,
                "median_ms": round(statistics.median(self.ms), 1), "max_ms": round(max(self.ms), 1)}  # fmt: skip


class Rig:
    """The API server, the kubelet bench and one daemon at a time."""

    def __init__(self, work: Path, app: Path) -> None:
        self.work, self.app = work, app
        self.api = ApiServer(work / "api")
        self.ns = Namespace()
        self.kubelet: KubeletBench | None = None
        self.daemons = 0
        self.device_root = make_device_root(work / "dev", {"kvm": "/dev/kvm"})

    def __enter__(self) -> Rig:
        self.api.__enter__()
        self.api.create_node(NODE)
        self.ns.open()
        self.kubelet = KubeletBench(self.ns, "1.35", log_dir=self.work / "kubelet")
        self.kubelet.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kubelet is not None:
            self.kubelet.close()
        self.ns.close()
        self.api.close()

    def daemon(self, mode: str = "both", kubeconfig: Path | None = None) -> DevicePluginDaemon:
        self.daemons += 1
        env = {"KUBECONFIG": str(kubeconfig or self.api.kubeconfig()), "PYTHONPATH": str(self.app)}
        args = ["--mode", mode, "--node-name", NODE, "--dra-slots", "4", *dra.DAEMON_ARGS]
        return DevicePluginDaemon(self.device_root, self.work / f"daemon{self.daemons}", ns=self.ns, env=env, args=args)

    def prepare(self, claims: list[tuple[str, str, str]], timeout: float = 60) -> dict[str, str]:
        return dra.prepare(self.ns, claims, timeout)

    def register(self, ok: bool = True, error: str = "") -> None:
        dra.register(self.ns, ok, error)

    def our_slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.slices() if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == "ate.dev"]


def in_sync(d: DevicePluginDaemon) -> bool:
    return d.metric("ate_devplugin_dra_slices_in_sync") == 1


# --- scenarios ------------------------------------------------------------------------


def prepare_flood(rig: Rig) -> dict[str, Any]:
    namespace = "flood"
    if rig.api.request("GET", f"/api/v1/namespaces/{namespace}")[0] == 404:
        rig.api.create_namespace(namespace)
        began = time.monotonic()
        rig.api.create_claims(namespace, [f"c{i}" for i in range(FLOOD)], NODE, "ate-dev-kvm-0")
        print(f"  {FLOOD} claims made in {time.monotonic() - began:.0f}s", flush=True)
    items = rig.api.must("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")["items"]
    claims = [(namespace, c["metadata"]["name"], c["metadata"]["uid"]) for c in items]
    assert rig.kubelet is not None
    with rig.daemon() as d:
        wait_until(lambda: in_sync(d), 60, "slices published")
        rig.kubelet.wait(KVM, allocatable=4096, timeout=60)
        health: list[int] = []
        with Sampler(d.proc.pid) as rss, Allocations(rig.kubelet) as allocs:  # type: ignore[union-attr]
            stop = threading.Event()

            def probe() -> None:
                while not stop.is_set():
                    with contextlib.suppress(OSError):
                        health.append(d.get("/healthz")[0])
                    time.sleep(0.1)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            began = time.monotonic()
            errors = rig.prepare(claims, timeout=120)
            took = time.monotonic() - began
            time.sleep(1)  # the Allocate calls after it, too
            stop.set()
            prober.join()
    reasons = list(errors.values())
    return {
        "claims": len(claims), "answered": len(errors), "prepared": reasons.count(""),
        "empty_reason": sum(1 for r in reasons if r.endswith(": ")),
        "failed": sum(1 for r in reasons if r), "example_failure": next((r for r in reasons if r), ""),
        "call_ms": round(took * 1000), "start_rss_mib": round(rss.start, 1), "peak_rss_mib": round(rss.peak, 1),
        "healthz_not_200": sum(1 for h in health if h != 200), "allocate": allocs.figures(),
    }  # fmt: skip


def api_hangs(rig: Rig) -> dict[str, Any]:
    rig.api.create_namespace("hang")
    [uid] = rig.api.create_claims("hang", ["held"], NODE, "ate-dev-kvm-0")
    d = rig.daemon(mode="dra")
    d.start()
    wait_until(lambda: in_sync(d), 60, "slices published")
    with rig.api.paused():
        began = time.monotonic()
        [reason] = rig.prepare([("hang", "held", uid)], timeout=60).values()
        took = time.monotonic() - began
        began = time.monotonic()
        code = d.stop(signal.SIGTERM, timeout=30)
        stop_s = time.monotonic() - began
    return {"prepare_ms": round(took * 1000), "reason": reason, "sigterm_to_exit_ms": round(stop_s * 1000),
            "exit": code}  # fmt: skip


class _EndsAtOnce(BaseHTTPRequestHandler):
    """An API server that answers lists, nodes and writes, and ends every watch at once."""

    watches = 0

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if "watch=" in self.path:
            type(self).watches += 1
            self._empty()
        elif self.path.startswith("/api/v1/nodes/"):
            self._send(200, {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "uid": "u"}})
        else:
            self._send(200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                             "metadata": {"resourceVersion": "1"}, "items": []})  # fmt: skip

    def _empty(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["metadata"] = {**body["metadata"], "name": "s1", "resourceVersion": "2"}
        self._send(201, body)


def watch_ends(rig: Rig, seconds: float = 10) -> dict[str, Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndsAtOnce)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = rig.work / "stub.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "s",
        "clusters": [{"name": "s", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "s", "user": {"token": "t"}}],
        "contexts": [{"name": "s", "context": {"cluster": "s", "user": "s"}}],
    }))  # fmt: skip
    try:
        with rig.daemon(mode="dra", kubeconfig=kubeconfig) as d:
            time.sleep(2)
            pid = d.proc.pid  # type: ignore[union-attr]
            w0, c0 = _EndsAtOnce.watches, cpu_s(pid)
            time.sleep(seconds)
            w1, c1 = _EndsAtOnce.watches, cpu_s(pid)
    finally:
        server.shutdown()
    return {"window_ms": round(seconds * 1000), "watches_per_s": round((w1 - w0) / seconds, 1),
            "cpu_percent": round(100 * (c1 - c0) / seconds, 1)}  # fmt: skip


def foreign_slices(rig: Rig) -> dict[str, Any]:
    assert rig.kubelet is not None
    began = time.monotonic()
    rig.api.create_slices([f"foreign-{i}" for i in range(FLOOD)], NODE, "other-pool", 1)
    print(f"  {FLOOD} slices made in {time.monotonic() - began:.0f}s", flush=True)
    d = rig.daemon()
    d.spawn()
    d.wait_healthy(60)
    rig.kubelet.wait(KVM, allocatable=4096, timeout=60)
    with Sampler(d.proc.pid) as rss, Allocations(rig.kubelet) as allocs:  # type: ignore[union-attr]
        began = time.monotonic()
        wait_until(lambda: len(rig.our_slices()) <= 1 and in_sync(d), 1800, "foreign slices deleted", interval=1)
        took = time.monotonic() - began
    d.stop()
    return {"slices": FLOOD, "until_clean_ms": round(took * 1000), "deleted_per_s": round(FLOOD / took, 1),
            "peak_rss_mib": round(rss.peak, 1), "allocate": allocs.figures()}  # fmt: skip


def bad_names(rig: Rig) -> dict[str, Any]:
    with rig.daemon(mode="dra") as d:
        wait_until(lambda: in_sync(d), 60, "slices published")
        answers = rig.prepare([
            ("ns", "../../../api/v1/namespaces/kube-system/secrets/x", "u1"),
            ("a/b", "c", "u2"),
            ("..", "c", "u3"),
        ])  # fmt: skip
    return {"errors": answers}


def registration_error(rig: Rig) -> dict[str, Any]:
    huge = "x" * (1 << 20)
    with rig.daemon(mode="dra") as d:
        for _ in range(5):
            rig.register(ok=False, error=huge)
        status, body = d.get("/readyz")
        longest = max(len(line) for line in d.log_text().splitlines())
        refusals = sum(1 for line in d.log_lines() if "refused the DRA driver" in str(line.get("msg", "")))
    return {"readyz_status": status, "readyz_bytes": len(body), "longest_log_line_bytes": longest,
            "refusal_log_lines": refusals}  # fmt: skip


def generation_max(rig: Rig) -> dict[str, Any]:
    with rig.daemon(mode="dra") as d:
        wait_until(lambda: in_sync(d), 60, "slices published")
        rig.api.create_slices(["intruder"], NODE, NODE, 2**63 - 1)
        began = time.monotonic()
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: in_sync(d) and len(rig.our_slices()) == 1, 20, "in sync again", interval=0.2)
        back_s = time.monotonic() - began
        (rig.device_root / "kvm").rename(rig.device_root / "kvm.away")  # a device change: slices must follow
        try:
            began = time.monotonic()
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: in_sync(d) and all(not s["spec"].get("devices") for s in rig.our_slices()), 20,
                           "slots withdrawn", interval=0.2)  # fmt: skip
            follow_s = time.monotonic() - began
        finally:
            (rig.device_root / "kvm.away").rename(rig.device_root / "kvm")
        writes = "ate_devplugin_dra_slice_writes_total"
        failed = ("result", "failure")
        failures = sum(v for (name, labels), v in d.metrics().items() if name == writes and failed in labels)
        generations = sorted(s["spec"]["pool"]["generation"] for s in rig.our_slices())
    return {
        "in_sync_again_ms": round(back_s * 1000) if back_s < 20 else "not within 20 s",
        "followed_change_ms": round(follow_s * 1000) if follow_s < 20 else "not within 20 s",
        "failed_writes": int(failures),
        "highest_generation": max(generations, default=0),
    }


SCENARIOS: dict[str, Callable[[Rig], dict[str, Any]]] = {
    "bad_names": bad_names,
    "registration_error": registration_error,
    "generation_max": generation_max,
    "watch_ends": watch_ends,
    "prepare_flood": prepare_flood,
    "foreign_slices": foreign_slices,
    "api_hangs": api_hangs,
}


@contextlib.contextmanager
def rig_for(work: Path, app: Path) -> Iterator[Rig]:
    with Rig(work, app) as rig:
        yield rig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app", type=Path, default=REPO / "app", help="the source tree the daemon runs")
    parser.add_argument("--label", default="after", help="the key of this run in the result file (before, after)")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/ate-dra-faults"))
    parser.add_argument("--out", type=Path, required=True, help="the result file; other labels in it are kept")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    run: dict[str, Any] = results.setdefault(args.label, {})
    run.update(app=str(args.app), revision=_revision(args.app), loadavg=list(os.getloadavg()))
    with rig_for(args.work / str(os.getpid()), args.app) as rig:
        for name in args.only:
            print(f"{name} ...", flush=True)
            try:
                run[name] = SCENARIOS[name](rig)
            except Exception as exc:  # one scenario's failure is its figure
                run[name] = {"failed": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"  {json.dumps(run[name])[:1500]}", flush=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _revision(app: Path) -> str:
    """The commit of the tree the daemon ran (a dirty tree says so)."""
    git = ["git", "-C", str(app)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout
    return rev + ("+dirty" if dirty.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
