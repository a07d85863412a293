"""Device attributes and taints against real API servers (tests/harness/apiserver.py), and
allocation by the real scheduler of 1.37.

The publisher under test is the product's (dra/slices.py through dra/kube.py), writing
this machine's facts. On 1.37 (DRADeviceTaints GA) the taint is stored, and a new claim is
not allocated to a tainted device unless it tolerates the taint; on 1.35 (the gate off)
the API server drops the taint, and the publisher sees it, says so once and publishes
without taints from then on. The attributes are stored on both, and a claim can select on
them (a CPU model; hardware KVM, which these machines lack).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ate_devplugin.dra import kube
from ate_devplugin.dra.slices import SlicePublisher, chunks, resource_devices
from ate_devplugin.dra.taints import TaintBook
from ate_devplugin.kvm.attributes import Value, attributes
from ate_devplugin.kvm.facts import read_node_facts
from ate_devplugin.kvm.probe import check
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.observability.metrics import DraMetrics
from ate_devplugin.tasks import Guard, cancel
from tests.harness import apiserver, dra
from tests.harness.apiserver import ApiServer
from tests.harness.devices import DeviceNumber, add_device_node, make_device_root
from tests.harness.faults import SpawnDaemon
from tests.harness.kubelet import Namespace
from tests.harness.require import missing
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
DRIVER = "ate.dev"
CLASS = "kvm.ate.dev"
NAMESPACE = "workers"
RESOURCE = "/apis/resource.k8s.io/v1"


def facts() -> dict[str, Value]:
    """This machine's facts, the device's too where this process may open /dev/kvm."""
    probed = check("/dev/kvm", 5) if os.access("/dev/kvm", os.R_OK | os.W_OK) else None
    return attributes(read_node_facts(), probed.device_facts if probed and probed.passed else None)


@pytest.fixture(scope="module", params=["1.35", "1.37"], ids=["k8s1.35", "k8s1.37"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    release: str = request.param
    why = apiserver.missing(release) or apiserver.missing(release, "kube-scheduler")
    if why:
        missing(why)
    with ApiServer(tmp_path_factory.mktemp(f"apiserver-{release}"), release) as server:
        server.start_scheduler()
        server.create_namespace(NAMESPACE)
        server.must("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})
        server.must("POST", f"{RESOURCE}/deviceclasses", {"metadata": {"name": CLASS}, "spec": {"selectors": [
            {"cel": {"expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].resource == "{KVM}"'}}
        ]}})  # fmt: skip
        yield server


# The scheduler's tests: 1.35 drops the taint (the first test), so they run on 1.37 alone.
ON_1_37 = pytest.mark.parametrize("api", ["1.37"], indirect=True, ids=["k8s1.37"])


@pytest.fixture
def node(api: ApiServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A schedulable Node of this test's own (no kubelet: pods are bound, never run); gone
    after the test, so the scheduler looks at no other test's devices."""
    name = str(request.node.name).lower().replace("_", "-").split("[")[0][:50].strip("-")
    api.create_node(name)
    body = api.must("GET", f"/api/v1/nodes/{name}")
    body["status"] = {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                      "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
                                      "lastHeartbeatTime": None, "lastTransitionTime": None}]}  # fmt: skip
    api.must("PUT", f"/api/v1/nodes/{name}/status", body)
    # The API server's admission gave it node.kubernetes.io/not-ready, which only the node
    # lifecycle controller (not running) would take off: off it comes.
    body = api.must("GET", f"/api/v1/nodes/{name}")
    body["spec"].pop("taints", None)
    api.must("PUT", f"/api/v1/nodes/{name}", body)
    yield name
    api.request("DELETE", f"/api/v1/nodes/{name}")


@contextlib.asynccontextmanager
async def publisher(api: ApiServer, node: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SlicePublisher]:
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig()))
    client = kube.connect()
    deaths: list[str] = []
    pub = SlicePublisher(client, DRIVER, node, DraMetrics(CollectorRegistry()))
    pub.start(Guard(lambda name, error: deaths.append(f"{name}: {error}")))
    try:
        yield pub
    finally:
        for task in pub._tasks:
            await cancel(task, 1.0)
        await client.close()
    assert deaths == []


async def eventually(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Polls ``check`` (blocking HTTP, run in a thread: the publisher runs on this loop)."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.2)


def stored_devices(api: ApiServer, node: str) -> list[dict[str, Any]]:
    return [d for s in api.slices() if s["spec"]["nodeName"] == node for d in s["spec"]["devices"]]


async def test_attributes_are_stored_and_taints_on_1_37_only_where_1_35_drops_them_seen_once(
    api: ApiServer, node: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    attrs = facts()
    book = TaintBook(DRIVER)
    book.update(KVM, Reason.NOT_KVM)
    wanted = resource_devices(KVM, 110, 2, shared=True, attributes=attrs, taints=book.taints(KVM))
    async with publisher(api, node, monkeypatch) as pub:
        pub.publish(wanted)
        await eventually(pub.synced.is_set, "published")
        stored = stored_devices(api, node)
        [expected] = chunks(wanted)
        # 1.35 drops allowMultipleAllocations too (DRAConsumableCapacity off): slots only there.
        slots = ["ate-dev-kvm-0", "ate-dev-kvm-1"]
        assert [d["name"] for d in stored] == (slots if api.release == "1.35" else ["ate-dev-kvm", *slots])
        for device in stored:
            assert device["attributes"] == expected[0]["attributes"]  # typed, every one kept as written
        if api.release == "1.35":
            assert not any("taints" in d for d in stored)
            assert pub.taints is False
            assert pub.metrics.taints_dropped._value.get() == 1
        else:
            assert [d["taints"] for d in stored] == [[book.taints(KVM)[0].to_json()]] * len(stored)
            assert pub.taints is True
            assert pub.metrics.taints_dropped._value.get() == 0
        writes = sum(pub.metrics.slice_writes.labels(op, "success")._value.get() for op in ("create", "update"))
        # The probe passes: the taint goes (where it was stored), and nothing is written for
        # nothing where it was dropped.
        book.update(KVM, Reason.PASSED)
        pub.publish(resource_devices(KVM, 110, 2, shared=True, attributes=attrs, taints=book.taints(KVM)))
        await eventually(pub.synced.is_set, "untainted")
        await asyncio.sleep(1)
        assert not any("taints" in d for d in stored_devices(api, node))
        after = sum(pub.metrics.slice_writes.labels(op, "success")._value.get() for op in ("create", "update"))
        assert after - writes == (0 if api.release == "1.35" else 1)
    dropped = [r for r in caplog.records if "dropped the devices' taints" in r.getMessage()]
    assert len(dropped) == (1 if api.release == "1.35" else 0)
    print(api.release, "stored device:", stored[0])


def claim(name: str, selector: str = "", tolerate: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if tolerate:
        exactly["tolerations"] = [{"key": f"{DRIVER}/kvm-unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "kvm", "exactly": exactly}]}}}


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "vmm", "image": "vmm", "resources": {"claims": [{"name": "kvm"}]}}],
            "resourceClaims": [{"name": "kvm", "resourceClaimName": claim_name}],
        },
    }


class Workers:
    """Claims and pods in the test namespace, and what the scheduler made of them."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.base = f"/api/v1/namespaces/{NAMESPACE}"
        self.claims = f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims"
        self.made: list[str] = []

    def add(self, name: str, selector: str = "", tolerate: bool = False) -> None:
        self.api.must("POST", self.claims, claim(name, selector, tolerate))
        self.api.must("POST", f"{self.base}/pods", pod(name, name))
        self.made.append(name)

    def allocation(self, name: str) -> list[dict[str, Any]]:
        found = self.api.must("GET", f"{self.claims}/{name}")
        results: list[dict[str, Any]] = ((found.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []
        return results

    def bound_to(self, name: str) -> str:
        return str(self.api.must("GET", f"{self.base}/pods/{name}")["spec"].get("nodeName") or "")

    def unschedulable(self, name: str) -> str:
        """The scheduler's message while the pod cannot be scheduled; "" otherwise."""
        conditions = (self.api.must("GET", f"{self.base}/pods/{name}").get("status") or {}).get("conditions") or []
        for c in conditions:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message") or "")
        return ""

    def remove(self) -> None:
        for name in self.made:
            self.api.request("DELETE", f"{self.base}/pods/{name}?gracePeriodSeconds=0")
            self.api.request("DELETE", f"{self.claims}/{name}")


@ON_1_37
async def test_on_1_37_a_tainted_device_is_allocated_to_no_new_claim_but_a_tolerating_one(
    api: ApiServer, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = Workers(api)
    book = TaintBook(DRIVER)
    attrs = facts()
    book.update(KVM, Reason.TIMED_OUT)
    try:
        async with publisher(api, node, monkeypatch) as pub:
            pub.publish(resource_devices(KVM, 110, 2, shared=True, attributes=attrs, taints=book.taints(KVM)))
            await eventually(pub.synced.is_set, "tainted devices published")
            workers.add("plain")
            message = await eventually(lambda: workers.unschedulable("plain"), "the plain claim's pod unschedulable")
            print("while tainted:", message)
            assert workers.allocation("plain") == []
            workers.add("prober", tolerate=True)  # as the prober's claim will (docs/kvm-health.md)
            await eventually(lambda: workers.bound_to("prober") == node, "the tolerating pod bound")
            [result] = workers.allocation("prober")
            assert (result["driver"], result["pool"]) == (DRIVER, node)
            assert workers.unschedulable("plain")  # still: only a tolerating claim gets a tainted device
            book.update(KVM, Reason.PASSED)
            pub.publish(resource_devices(KVM, 110, 2, shared=True, attributes=attrs, taints=book.taints(KVM)))
            await eventually(lambda: workers.bound_to("plain") == node, "the plain pod bound once the taint is gone")
            [result] = workers.allocation("plain")
            assert (result["driver"], result["pool"]) == (DRIVER, node)
    finally:
        workers.remove()


@ON_1_37
async def test_on_1_37_claims_select_on_the_attributes(
    api: ApiServer, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attrs = facts()
    workers = Workers(api)
    cpu_model = attrs["cpuModel"]
    assert isinstance(cpu_model, int)
    model = f'device.attributes["{DRIVER}"].cpuModel == {cpu_model}'
    other = f'device.attributes["{DRIVER}"].cpuModel == {cpu_model + 1}'
    hardware = f'device.attributes["{DRIVER}"].kvmHardware == true'
    try:
        async with publisher(api, node, monkeypatch) as pub:
            pub.publish(resource_devices(KVM, 110, 2, shared=True, attributes=attrs))
            await eventually(pub.synced.is_set, "published")
            workers.add("same-model", model)
            workers.add("other-model", other)
            workers.add("hardware-kvm", hardware)
            await eventually(lambda: workers.bound_to("same-model") == node, "the matching claim's pod bound")
            # A worker that needs hardware KVM (a stock guest kernel) stays off a software KVM.
            pending = ["other-model"] if attrs["kvmHardware"] else ["other-model", "hardware-kvm"]
            for name in pending:
                message = await eventually(partial(workers.unschedulable, name), f"{name} unschedulable")
                print(f"{name}: {message}")
                assert workers.allocation(name) == []
    finally:
        workers.remove()


@ON_1_37
def test_on_1_37_the_daemons_own_probe_keeps_new_claims_off_a_broken_device(
    api: ApiServer, node: str, spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    """The whole path: our daemon (mode dra, --kvm-probe local) over a 1:3 node named kvm
    taints its devices, the scheduler allocates no new claim; the real node back, the
    probe passes, the taint goes and the claim is allocated."""
    root = make_device_root(tmp_path / "dev", {"kvm": DeviceNumber(1, 3)})
    workers = Workers(api)
    try:
        with Namespace() as ns:
            args = ["--mode", "dra", "--node-name", node, "--dra-slots", "2", *dra.DAEMON_ARGS]
            d = spawn_daemon(root, ns=ns, env={"KUBECONFIG": str(api.kubeconfig())}, args=args)
            wait_until(lambda: d.metric("ate_devplugin_dra_tainted_devices", resource_name=KVM) == 3, 30, "tainted")
            wait_until(lambda: d.metric("ate_devplugin_dra_slices_in_sync") == 1, 30, "published")
            workers.add("worker")
            message = wait_until(lambda: workers.unschedulable("worker"), 60, "the pod unschedulable")
            print("broken device:", message)
            assert workers.allocation("worker") == []
            (root / "kvm").unlink()
            add_device_node(root, "kvm", "/dev/kvm")
            wait_until(lambda: workers.bound_to("worker") == node, 60, "the pod bound once the probe passes")
            [result] = workers.allocation("worker")
            assert (result["driver"], result["pool"]) == (DRIVER, node)
            assert d.metric("ate_devplugin_dra_tainted_devices", resource_name=KVM) == 0
            d.stop()
    finally:
        workers.remove()
