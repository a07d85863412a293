"""The daemon's DRA driver publishes what its KVM probe finds, against real API servers.

Our daemon runs in mode dra with ``--kvm-probe local`` (the default), in a private mount
namespace, over a device root whose ``kvm`` node is this machine's KVM: its devices carry
the node's and the device's facts as attributes; a ``1:3`` node swapped in taints them on
1.37 (DRADeviceTaints GA) and the taint goes when the real node is back; 1.35 drops the
taint, which the daemon sees, logs once and counts. The scheduler's side of a taint (a
new claim is not allocated to a tainted device) is tests/kvm/test_dra_apiserver.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ate_devplugin.kvm.facts import read_node_facts
from tests.harness import apiserver, dra
from tests.harness.apiserver import ApiServer
from tests.harness.devices import DeviceNumber, add_device_node, make_device_root
from tests.harness.faults import SpawnDaemon
from tests.harness.kubelet import Namespace
from tests.harness.require import missing
from tests.harness.wait import wait_until

pytestmark = pytest.mark.skipif(not Path("/dev/kvm").exists(), reason="needs /dev/kvm")


@pytest.fixture(scope="module", params=["1.35", "1.37"], ids=["k8s1.35", "k8s1.37"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    release: str = request.param
    why = apiserver.missing(release)
    if why:
        missing(why)
    with ApiServer(tmp_path_factory.mktemp(f"apiserver-{release}"), release) as server:
        yield server


def devices(api: ApiServer, node: str) -> list[dict[str, Any]]:
    slices = [s for s in api.slices() if s["spec"]["nodeName"] == node and s["spec"]["driver"] == "ate.dev"]
    return [d for s in slices for d in s["spec"].get("devices") or []]


def swap(root: Path, number: DeviceNumber) -> None:
    add_device_node(root, ".kvm.new", number)
    (root / ".kvm.new").rename(root / "kvm")


def test_the_probe_sets_the_attributes_and_the_taint_of_the_published_devices(
    api: ApiServer, spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    node = f"kvm-wiring-{api.release.replace('.', '-')}"
    api.create_node(node)
    root = make_device_root(tmp_path / "dev", {"kvm": "/dev/kvm"})
    with Namespace() as ns:
        args = ["--mode", "dra", "--node-name", node, "--dra-slots", "2", *dra.DAEMON_ARGS]
        d = spawn_daemon(root, ns=ns, env={"KUBECONFIG": str(api.kubeconfig())}, args=args)
        # Published once the probe passed: the device's facts with the node's.
        wait_until(lambda: all("cpuidDigest" in x["attributes"] for x in devices(api, node) or [{"attributes": {}}]),
                   60, "the device facts published")  # fmt: skip
        published = devices(api, node)
        names = ["ate-dev-kvm-0", "ate-dev-kvm-1"]
        assert [x["name"] for x in published] == (names if api.release == "1.35" else ["ate-dev-kvm", *names])
        attributes = published[0]["attributes"]
        assert attributes["resource"] == {"string": "ate.dev/kvm"}
        assert attributes["kvmImplementation"] == {"string": read_node_facts().kvm_implementation}
        assert attributes["kvmApiVersion"] == {"int": 12}
        assert all(x["attributes"] == attributes and "taints" not in x for x in published)
        print(api.release, "attributes:", sorted(attributes))

        swap(root, DeviceNumber(1, 3))
        if api.release == "1.37":
            taint = {"key": "ate.dev/kvm-unhealthy", "value": "not-a-kvm-device", "effect": "NoSchedule"}

            def tainted() -> bool:
                stored = devices(api, node)
                return bool(stored) and all(
                    [{k: t[k] for k in taint} for t in x.get("taints", [])] == [taint] for x in stored
                )

            wait_until(tainted, 30, "every device tainted")
            assert d.metric("ate_devplugin_dra_tainted_devices", resource_name="ate.dev/kvm") == 3
        else:
            wait_until(lambda: d.metric("ate_devplugin_dra_taints_dropped") == 1, 30, "the drop seen")
            assert not any("taints" in x for x in devices(api, node))
        wait_until(lambda: d.metric("ate_devplugin_dra_slices_in_sync") == 1, 30, "in sync")

        swap(root, DeviceNumber(10, 232))
        wait_until(lambda: d.metric("ate_devplugin_kvm_probe_state", resource_name="ate.dev/kvm", state="passed") == 1,
                   30, "the probe passes again")  # fmt: skip
        wait_until(lambda: d.metric("ate_devplugin_dra_slices_in_sync") == 1, 30, "in sync")
        assert not any("taints" in x for x in devices(api, node))
        assert d.metric("ate_devplugin_dra_tainted_devices", resource_name="ate.dev/kvm") == 0
        dropped = [x for x in d.log_lines() if "dropped the devices' taints" in x.get("msg", "")]
        assert len(dropped) == (1 if api.release == "1.35" else 0)
        d.stop()
