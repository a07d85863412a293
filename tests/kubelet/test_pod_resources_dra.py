"""Which pods hold the device, in mode dra, read from the kubelet's own PodResources server.

The kubelet's DRA side (``kubelet-bench dra``: its DRA manager, plugin manager and, with
``--pod-resources-socket``, its PodResources v1 server) prepares claims for pods against
a real API server; our daemon, the DRA driver of that node with ``--pod-resources on``,
reads which pods hold its devices from that server: every device of a claim it prepared
is a unit, and a device that goes is reported with the pods whose claims hold it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ate_devplugin.api.podresources.v1 import api_pb2 as pb
from ate_devplugin.api.podresources.v1 import api_pb2_grpc
from tests.harness import apiserver
from tests.harness.apiserver import ApiServer
from tests.harness.daemon import DevicePluginDaemon
from tests.harness.devices import add_device_node, remove_device_node
from tests.harness.faults import SpawnDaemon
from tests.harness.kubelet import KubeletDra
from tests.harness.require import missing, require_kubelet_bench
from tests.harness.wait import wait_until

KVM = "ate.dev/kvm"
NAMESPACE = "vms"
SLOTS = 4


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    why = apiserver.missing()
    if why:
        missing(why)
    with ApiServer(tmp_path_factory.mktemp("apiserver")) as server:
        server.create_namespace(NAMESPACE)
        yield server


@pytest.fixture(params=["1.35", "1.37"], ids=["k8s1.35", "k8s1.37"])
def dra_release(request: pytest.FixtureRequest) -> str:
    """The kubelet's DRA side of these releases (1.29 has none)."""
    require_kubelet_bench(request.param)
    return str(request.param)


def units(d: DevicePluginDaemon, pod: str) -> float:
    return d.metric("ate_devplugin_pod_units", resource_name=KVM, namespace=NAMESPACE, pod=pod, container="main")


def test_pods_holding_claims_of_our_driver_are_read_from_the_kubelet(
    api: ApiServer, dra_release: str, tmp_path: Path, device_root: Path, spawn_daemon: SpawnDaemon
) -> None:
    node = f"pr-dra-{dra_release.replace('.', '-')}"
    api.create_node(node)
    with KubeletDra(
        dra_release, api.kubeconfig(apiserver.ADMIN), node, tmp_path / "kubelet", pod_resources=True
    ) as kubelet:
        d = spawn_daemon(
            device_root,
            plugin_dir=str(tmp_path / "device-plugins"),
            env={"KUBECONFIG": str(api.kubeconfig())},
            args=[
                "--mode", "dra", "--node-name", node, "--dra-slots", str(SLOTS),
                "--registry-dir", str(kubelet.registry_dir), "--dra-dir", str(tmp_path / "plugins" / "ate.dev"),
                "--pod-resources", "on", "--pod-resources-socket", str(kubelet.pod_resources_socket),
                "--pod-resources-interval", "0",  # events only: each List below is one the driver asked for
            ],
        )  # fmt: skip
        kubelet.request("wait_registered", driver="ate.dev", timeout_s=60.0, timeout=90)
        wait_until(lambda: d.metric("ate_devplugin_dra_slices_in_sync") == 1, 60, "slices published")
        wait_until(lambda: kubelet.request("slices", driver="ate.dev")["devices"], 30, "the kubelet sees the slices")
        wait_until(d.ready, 30, "readyz")
        claims: list[dict[str, Any]] = kubelet.request(
            "make_claims", namespace=NAMESPACE, driver="ate.dev", count=2, prefix=node
        )["claims"]
        pods = [c["pod_name"] for c in claims]
        for c in claims:
            prepared = kubelet.request(
                "prepare", namespace=NAMESPACE, pod_name=c["pod_name"], pod_uid=c["pod_uid"], claims=[c["claim"]]
            )
            assert prepared["cdi_devices"] == ["ate.dev/kvm=kvm"]

        # The kubelet lists each pod's claim with the device our driver prepared ...
        assert _claims_listed(kubelet.pod_resources_socket) == sorted(
            (c["pod_name"], "main", c["claim"], "ate.dev", node, c["device"], ["ate.dev/kvm=kvm"]) for c in claims
        )
        # ... and each is a unit of its resource, read after the prepares.
        wait_until(lambda: all(units(d, p) == 1 for p in pods), 30, "the claims' pods read from PodResources")
        assert d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == 2
        assert d.metric("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0

        # The device goes: the pods whose claims hold it are counted and named.
        remove_device_node(device_root, "kvm")
        wait_until(lambda: d.metric("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 2, 30, "counted")
        wait_until(lambda: _lost(d), 30, "the loss logged")
        (line,) = _lost(d)
        assert line["level"] == "warning"
        assert line["pods"] == sorted(f"{NAMESPACE}/{p}" for p in pods)
        assert line["msg"] == "device lost while pods hold its units: " + ", ".join(line["pods"])
        add_device_node(device_root, "kvm", "/dev/kvm")
        wait_until(lambda: d.metric("ate_devplugin_pods_on_unhealthy_device", resource_name=KVM) == 0, 30, "back")

        # A pod gone (its claim unprepared): its series goes with the List after the unprepare.
        first = claims[0]
        kubelet.request(
            "unprepare",
            namespace=NAMESPACE,
            pod_name=first["pod_name"],
            pod_uid=first["pod_uid"],
            claims=[first["claim"]],
        )
        wait_until(lambda: d.metric("ate_devplugin_pods_holding_units", resource_name=KVM) == 1, 30, "one pod left")
        assert math.isnan(units(d, first["pod_name"]))  # no series
        assert units(d, claims[1]["pod_name"]) == 1


def _lost(d: DevicePluginDaemon) -> list[dict[str, Any]]:
    return [line for line in d.log_lines() if str(line.get("msg", "")).startswith("device lost")]


def _claims_listed(socket: Path) -> list[tuple[str, str, str, str, str, str, list[str]]]:
    """What the kubelet's server lists, with the API's own messages: per claim device,
    (pod, container, claim, driver, pool, device, CDI names)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        answer = stub.List(pb.ListPodResourcesRequest(), timeout=10)
    return sorted(
        (p.name, c.name, claim.claim_name, r.driver_name, r.pool_name, r.device_name, [x.name for x in r.cdi_devices])
        for p in answer.pod_resources
        for c in p.containers
        for claim in c.dynamic_resources
        for r in claim.claim_resources
    )
