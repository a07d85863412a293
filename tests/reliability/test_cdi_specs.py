"""The CDI spec as state the daemon keeps, beside the kubelet's real device manager: the
spec or its directory removed (a reboot empties /var/run/cdi), rewritten by someone else,
the directory read-only or swapped for a symlink, a foreign spec under our file name.
Allocate never names a CDI device whose spec is not on disk."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import grpc
import pytest

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from tests.harness.daemon import DevicePluginDaemon, MakeDaemon
from tests.harness.faults import log_matches, remove_tree, set_read_only, swap_in
from tests.harness.kubelet import KubeletBench, Namespace
from tests.harness.wait import wait_until
from tests.reliability.test_hostile_peers import KVM, allocate_request, full, plugin_target

CDI_DIR = "/var/lib/cdi"  # inside the bench's namespace (its tmpfs), so it can be remounted
SPEC = "ate.dev-kvm.json"
CDI_KVM = "resources:\n  - {name: ate.dev/kvm, devices: [/dev/kvm], allocate: cdi}\n"
BOTH_KVM = "resources:\n  - {name: ate.dev/kvm, devices: [/dev/kvm], allocate: both}\n"


def cdi_daemon(daemon: MakeDaemon, kubelet: KubeletBench, config: str = CDI_KVM) -> DevicePluginDaemon:
    d = daemon(config, env={"ATE_DEVPLUGIN_CDI_DIR": CDI_DIR})
    full(kubelet)
    return d


def spec_path(ns: Namespace) -> Path:
    return ns.path(f"{CDI_DIR}/{SPEC}")


def ours(ns: Namespace) -> bool:
    try:
        document = json.loads(spec_path(ns).read_text())
    except (OSError, ValueError):
        return False
    nodes = document["devices"][0]["containerEdits"]["deviceNodes"]
    return bool(document["kind"] == KVM and [n["path"] for n in nodes] == ["/dev/kvm"])


def allocate_status(ns: Namespace) -> tuple[grpc.StatusCode, list[str]]:
    """The status of an Allocate of kvm-0 and the CDI names it answered."""
    with grpc.insecure_channel(plugin_target(ns)) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        try:
            response = stub.Allocate(allocate_request("kvm-0"), timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), []
    return grpc.StatusCode.OK, [c.name for c in response.container_responses[0].cdi_devices]


def back_within(ns: Namespace, what: str, timeout: float = 10) -> float:
    begin = time.monotonic()
    wait_until(lambda: ours(ns), timeout, f"the spec back after {what}", interval=0.005)
    took = time.monotonic() - begin
    print(f"CDI spec back {took * 1000:.0f} ms after {what}")
    return took


def test_a_removed_or_tampered_spec_is_written_again(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon
) -> None:
    d = cdi_daemon(daemon, kubelet)
    wait_until(lambda: ours(kubelet_ns), 10, "the spec written")
    assert allocate_status(kubelet_ns) == (grpc.StatusCode.OK, ["ate.dev/kvm=kvm"])

    spec_path(kubelet_ns).unlink()
    back_within(kubelet_ns, "the file was removed")

    remove_tree(kubelet_ns.path(CDI_DIR))  # what a reboot does to /var/run/cdi
    back_within(kubelet_ns, "the directory was removed")

    tampered = json.loads(spec_path(kubelet_ns).read_text())
    tampered["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] = "/dev/sda"
    tmp = kubelet_ns.path(f"{CDI_DIR}/.tampered")
    tmp.write_text(json.dumps(tampered))
    os.rename(tmp, spec_path(kubelet_ns))
    back_within(kubelet_ns, "the spec was rewritten by someone else")
    assert log_matches(d.log_lines(), "changed by someone else")
    assert allocate_status(kubelet_ns) == (grpc.StatusCode.OK, ["ate.dev/kvm=kvm"])
    assert d.ready()


@pytest.mark.parametrize("allocate", ["cdi", "both"])
def test_a_read_only_cdi_directory_is_counted_unready_then_recovers(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, allocate: str
) -> None:
    kubelet_ns.path(CDI_DIR).mkdir()
    set_read_only(kubelet_ns, CDI_DIR, True)  # as /var/run/cdi after a reboot, mounted read-only
    d = cdi_daemon(daemon, kubelet, CDI_KVM if allocate == "cdi" else BOTH_KVM)

    def failures() -> float:
        return d.metric("ate_devplugin_cdi_spec_updates_total", resource_name=KVM, action="write", result="failure")

    wait_until(lambda: failures() >= 1, 10, "the failed write counted")
    status, body = d.get("/readyz")
    assert status == 503
    assert b"CDI spec of ate.dev/kvm not in place" in body
    assert b"Read-only" in body
    if allocate == "cdi":
        assert allocate_status(kubelet_ns)[0] == grpc.StatusCode.FAILED_PRECONDITION
    else:  # device specs only
        assert allocate_status(kubelet_ns) == (grpc.StatusCode.OK, [])
    wait_until(lambda: failures() >= 3, 20, "retries")
    set_read_only(kubelet_ns, CDI_DIR, False)
    back_within(kubelet_ns, "the directory became writable", timeout=15)
    wait_until(d.ready, 10, "ready again")
    assert allocate_status(kubelet_ns) == (grpc.StatusCode.OK, ["ate.dev/kvm=kvm"])
    errors = log_matches(d.log_lines(), "CDI spec not in place")
    assert len(errors) == 1, errors  # one line for the failure, however often retried


def test_never_through_a_symlink_nor_over_a_foreign_spec(
    kubelet: KubeletBench, kubelet_ns: Namespace, daemon: MakeDaemon, tmp_path: Path
) -> None:
    d = cdi_daemon(daemon, kubelet)
    wait_until(lambda: ours(kubelet_ns), 10, "the spec written")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / SPEC
    victim.write_text('{"cdiVersion": "0.6.0", "kind": "other.vendor/kvm", "devices": []}')
    # The directory swapped for a symlink to another one holding a file of our name.
    link = kubelet_ns.path(CDI_DIR + ".link")
    os.symlink(elsewhere, link)
    swap_in(kubelet_ns.path(CDI_DIR), link)
    wait_until(
        lambda: b"symlink" in d.get("/readyz")[1],
        10,
        lambda: f"unready, saying why (/readyz: {d.get('/readyz')[1]!r}; log: {d.log_text()[-3000:]})",
    )
    assert allocate_status(kubelet_ns)[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert json.loads(victim.read_text())["kind"] == "other.vendor/kvm"

    # A real directory again, holding another vendor's spec of our file name.
    real = kubelet_ns.path(CDI_DIR + ".new")
    real.mkdir()
    foreign = '{"cdiVersion": "0.6.0", "kind": "other.vendor/kvm", "devices": []}'
    (real / SPEC).write_text(foreign)
    swap_in(kubelet_ns.path(CDI_DIR), real)
    wait_until(lambda: log_matches(d.log_lines(), "kind 'other.vendor/kvm'"), 10, "a warning naming the kind")
    assert b"not ours" in d.get("/readyz")[1]
    assert d.stop() == 0
    assert spec_path(kubelet_ns).read_text() == foreign  # neither overwritten nor removed
    assert victim.exists()
