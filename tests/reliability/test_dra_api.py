"""The DRA driver against a real kube-apiserver + etcd under hostile input, in mode both
next to the kubelet's device manager: what crosses processes.

The test plays the kubelet's DRA side (tests/harness/dra.py) and the other clients of the
API server (tests/harness/apiserver.py). Every assertion is about answers and state,
never about how long something took; bench/dra_faults.py measures the same scenarios.
"""

from __future__ import annotations

import math
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import apiserver, dra
from tests.harness.apiserver import ApiServer, WatchCutter
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.faults import SpawnDaemon
from tests.harness.kubelet import KubeletBench, Namespace
from tests.harness.require import missing, require_kubelet_bench
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
MAX_INT64 = 2**63 - 1
CAP = 128  # claims read per prepare call (dra/service.py MAX_CLAIMS_PER_CALL)


@pytest.fixture
def kubelet_version() -> str:
    """The release the e2e cluster runs: these tests are about the DRA side, not the bench's."""
    require_kubelet_bench("1.35")
    return "1.35"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    why = apiserver.missing()
    if why:
        missing(why)
    with ApiServer(tmp_path_factory.mktemp("apiserver")) as server:
        yield server


@pytest.fixture
def node(api: ApiServer, request: pytest.FixtureRequest) -> str:
    """A Node of this test's own: tests sharing the API server see none of each other's slices."""
    name = str(request.node.name).lower().replace("_", "-")[:50].strip("-")
    api.create_node(name)
    return name


DriverDaemon = Callable[..., DevicePluginDaemon]


@pytest.fixture
def driver(
    api: ApiServer, node: str, kubelet_ns: Namespace, device_root: Path, spawn_daemon: SpawnDaemon
) -> DriverDaemon:
    """``driver(mode="both", start=True)``: our daemon as this node's DRA driver."""

    def make(mode: str = "both", start: bool = True, kubeconfig: Path | None = None) -> DevicePluginDaemon:
        args = ["--mode", mode, "--node-name", node, "--dra-slots", "4", *dra.DAEMON_ARGS]
        env = {"KUBECONFIG": str(kubeconfig or api.kubeconfig())}
        return spawn_daemon(device_root, ns=kubelet_ns, env=env, args=args, start=start)

    return make


def ours(api: ApiServer, node: str) -> list[dict[str, Any]]:
    return [s for s in api.slices() if s["spec"]["nodeName"] == node and s["spec"]["driver"] == "ate.dev"]


def count(d: DevicePluginDaemon, name: str, **labels: str) -> float:
    """A counter's value; 0 for a series not exported (nothing counted yet)."""
    value = d.metric(name, **labels)
    return 0.0 if math.isnan(value) else value


def in_sync(d: DevicePluginDaemon) -> bool:
    return d.metric("ate_devplugin_dra_slices_in_sync") == 1


def published(api: ApiServer, node: str, d: DevicePluginDaemon, slots: int) -> bool:
    slices = ours(api, node)
    return (
        in_sync(d)
        and len(slices) == 1
        and slices[0]["spec"]["pool"]["name"] == node
        and len(slices[0]["spec"].get("devices") or []) == slots  # the API server drops an empty list
    )


class Allocations:
    """Allocate through the kubelet's device manager, pod after pod, on a thread, until
    stopped: how many, and any that did not get the device."""

    def __init__(self, kubelet: KubeletBench) -> None:
        self.kubelet = kubelet
        self.done = 0
        self.wrong: list[str] = []
        self.ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pod = f"pod-{self.done}"
            try:
                alloc = self.kubelet.allocate(pod, "main", {KVM: 1}, timeout=60)
                if not (alloc.devices or alloc.cdi_devices):
                    self.wrong.append(f"{pod}: nothing allocated")
                if alloc.allocate_s is not None:
                    self.ms.append(alloc.allocate_s * 1000)
            except Exception as exc:
                self.wrong.append(f"{pod}: {exc}")
            self.kubelet.remove_pod(pod)
            self.done += 1

    def __enter__(self) -> Allocations:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def test_allocate_stays_right_while_the_dra_side_is_flooded_with_claims(
    api: ApiServer, node: str, driver: DriverDaemon, kubelet: KubeletBench, kubelet_ns: Namespace
) -> None:
    namespace = node
    api.create_namespace(namespace)
    uids = api.create_claims(namespace, [f"c{i}" for i in range(CAP)], node, "ate-dev-kvm-0")
    claims = [(namespace, f"c{i}", uid) for i, uid in enumerate(uids)]
    claims += [(namespace, f"absent-{i}", f"u-absent-{i}") for i in range(10_000 - CAP)]
    d = driver()
    wait_until(lambda: published(api, node, d, 4), 60, "slots published")
    kubelet.wait(KVM, allocatable=4096, timeout=60)
    with Allocations(kubelet) as allocs:
        wait_until(lambda: allocs.done >= 3, 60, "Allocate before the flood")
        for _ in range(3):  # the kubelet would never send these: a flood
            errors = dra.prepare(kubelet_ns, claims, timeout=120)
            assert len(errors) == 10_000
            assert [errors[uid] for uid in uids] == [""] * CAP
            refused = {e for uid, e in errors.items() if uid.startswith("u-absent-")}
            assert refused == {f"more than {CAP} claims in one call; this one is not read"}
        done = allocs.done
        wait_until(lambda: allocs.done >= done + 3, 60, "Allocate after the flood")
    assert allocs.wrong == []
    assert d.get("/healthz")[0] == 200
    print(f"Allocate meanwhile: {allocs.done} calls, max {max(allocs.ms, default=0):.1f} ms")


def test_ten_thousand_foreign_slices_are_deleted_while_allocate_stays_right(
    api: ApiServer, node: str, driver: DriverDaemon, kubelet: KubeletBench
) -> None:
    api.create_slices([f"{node}-foreign-{i}" for i in range(10_000)], node, "other-pool", 1)
    d = driver(start=False)
    d.spawn()
    d.wait_healthy(60)
    kubelet.wait(KVM, allocatable=4096, timeout=60)
    with Allocations(kubelet) as allocs:
        wait_until(lambda: published(api, node, d, 4), 1200, lambda: f"{len(ours(api, node))} slices left")
    assert allocs.wrong == []
    assert allocs.done > 0
    assert count(d, "ate_devplugin_dra_slice_writes_total", op="delete", result="success") >= 10_000
    assert count(d, "ate_devplugin_dra_slice_writes_total", op="delete", result="failure") == 0
    print(f"Allocate meanwhile: {allocs.done} calls, max {max(allocs.ms, default=0):.1f} ms")


def test_a_slice_at_the_last_generation_leaves_the_pool_writable(
    api: ApiServer, node: str, driver: DriverDaemon, device_root: Path
) -> None:
    d = driver(mode="dra")
    wait_until(lambda: published(api, node, d, 4), 60, "slots published")
    api.create_slices([f"{node}-intruder"], node, node, MAX_INT64)  # another client, in our pool
    wait_until(lambda: published(api, node, d, 4), 60, "the stray slice deleted")

    def pushed() -> str:
        """Our own slice pushed to the last generation by another client: its name; "" on a
        conflict (the daemon updated it meanwhile, as when the KVM probe's verdict came in)."""
        [mine] = ours(api, node)
        assert mine["spec"]["pool"]["generation"] < MAX_INT64
        mine["spec"]["pool"]["generation"] = MAX_INT64
        status, answer = api.request("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{mine['metadata']['name']}", mine)
        assert status in (200, 409), answer
        return str(mine["metadata"]["name"]) if status == 200 else ""

    pushed_name = wait_until(pushed, 60, "our slice at the last generation")
    (device_root / "kvm").rename(device_root / "kvm.away")  # a change the slices must follow
    wait_until(lambda: published(api, node, d, 0), 60, "slots withdrawn")
    [fresh] = ours(api, node)
    assert fresh["metadata"]["name"] != pushed_name  # the pool was written afresh
    assert fresh["spec"]["pool"]["generation"] == 1
    (device_root / "kvm.away").rename(device_root / "kvm")
    wait_until(lambda: published(api, node, d, 4), 60, "slots back")
    # No write was refused for its generation: none carried one past the limit. The only
    # failure a write may meet here is a conflict with the PUT above, when the daemon wrote
    # before its watch had seen it (a stale resourceVersion, retried): 4 runs in 5 here.
    failed = [line["msg"] for line in d.log_lines() if line["msg"].startswith("writing resource slices failed")]
    assert all(": 409 " in msg and "has been modified" in msg for msg in failed), failed
    assert count(d, "ate_devplugin_dra_slice_writes_total", op="create", result="failure") == 0
    assert count(d, "ate_devplugin_dra_slice_writes_total", op="update", result="failure") == len(failed)


def test_an_api_server_that_hangs_fails_prepare_with_a_reason_and_stop_is_bounded(
    api: ApiServer, node: str, driver: DriverDaemon, kubelet_ns: Namespace
) -> None:
    api.create_namespace(node)
    [uid] = api.create_claims(node, ["held"], node, "ate-dev-kvm-0")
    d = driver(mode="dra")
    wait_until(lambda: published(api, node, d, 4), 60, "slots published")
    with api.paused():
        [reason] = dra.prepare(kubelet_ns, [(node, "held", uid)], timeout=44).values()
        assert reason.startswith(f"cannot read claim {node}/held: GET /apis/resource.k8s.io/v1/namespaces/")
        assert reason.endswith("no answer from the API server within 5s")
        code = d.stop(signal.SIGTERM, timeout=15)  # SIGKILL after that: then -9
    assert code == 0
    assert "could not delete this node's resource slices" in d.log_text()
    assert any(line.get("msg") == "stopped" for line in d.log_lines())


WATCH_ENDED = re.compile(r"the API server ended the watch after [0-9.]+s; watching again in ([0-9.]+)s")


def test_a_watch_that_ends_at_once_is_asked_again_only_after_a_growing_backoff(
    api: ApiServer, node: str, driver: DriverDaemon
) -> None:
    with WatchCutter(api) as cutter:
        d = driver(mode="dra", kubeconfig=cutter.kubeconfig())
        wait_until(lambda: published(api, node, d, 4), 60, "slots published through the front")

        def delays() -> list[float]:
            return [float(m[1]) for line in d.log_lines() if (m := WATCH_ENDED.fullmatch(str(line.get("msg"))))]

        wait_until(lambda: len(delays()) >= 5, 120, lambda: f"five watches ended: {delays()}", interval=0.2)
        seen, asked = delays(), cutter.watches
    # Each watch asked for came after the delay logged for the one before (one may be on its way).
    assert len(seen) <= asked <= len(seen) + 1
    bound = 1.0  # the driver's first delay is drawn from [0.5, 1] s, each bound doubles, up to 30 s
    for delay in seen:
        assert bound / 2 - 0.05 <= delay <= bound + 0.05, seen  # logged with one decimal
        bound = min(30.0, bound * 2)
