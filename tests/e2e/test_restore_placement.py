"""Restore placement in dra mode on the real 1.37 cluster (two nodes, containerd 2, cgroup v2):
docs/restore-placement.md's worked example, end to end.

The chart with ``dra.mode=dra`` (the prober on, as by default) serves /dev/kvm and
/dev/net/tun from each node's own device directory. This node's CPU profile is recorded by
``ate-devplugin cpu-profile`` in a pod granted /dev/kvm through a claim (uid 0, no
capability); ``ate-devplugin restore-profile`` builds ``here`` of it, and tests/e2e/restore.py
two it cannot restore: ``one_more`` (one feature more, which this node's KVM does not offer)
and ``other_tsc`` (10 % another TSC frequency, which this KVM cannot scale to). A ``helm
upgrade`` puts them in deviceConfig. Asserted: every kvm device of both nodes' ResourceSlices
carries ``restore_here`` true and the two others false, with the same daemon pods (no
restart); each daemon's log says once why not (the missing feature, the TSC) and
``ate_devplugin_kvm_restore_answer`` says ``missing-features`` and ``tsc``; the micro-VM
worker (docs/examples/microvm-worker-pod.yaml) whose claim selects ``restore_here == true``
boots its guest, the workers selecting the two others stay Pending with the scheduler's
reason. Then a ``helm upgrade`` that drops one_more's extra feature flips its attribute
without a restart, and its Pending worker is scheduled and boots.

Each device directory is the node's own (hostPaths.dev), the host's /dev is never touched.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import Cluster, Node, wait_until
from tests.e2e.restore import (
    PROFILES,
    Profiles,
    answer_lines,
    answers,
    build,
    excerpt,
    identity,
    last_said,
    record,
    recorder_pod,
    said,
    unschedulable,
)
from tests.e2e.userpath import (
    MICROVM_WORKERS,
    NAMESPACE,
    RELEASE,
    RESOURCE,
    TUN,
    Helm,
    booted_as_shipped,
    claiming,
    ensure_workload_namespace,
    finished,
    kvm_probe_states,
    run_pod,
    wait_plugin_ready,
    worker,
)

PRIVATE_DEV = "/run/ate-e2e-restore-dev"  # in each node's tmpfs: the host's /dev is never touched
DRIVER = "ate.dev"
PART_OF = {"app.kubernetes.io/part-of": "ate-e2e-restore"}  # this module's pods, deleted at its end
INSTALL = ("--set", "dra.mode=dra", "--set", "dra.slots=2", "--set", f"hostPaths.dev={PRIVATE_DEV}")
RECORD_TEMPLATE = "restore-record"
EXPECTED = {"here": True, "one_more": False, "other_tsc": False}


def values(work: Path, name: str, profiles: dict[str, Any] | None) -> str:
    """A values file of kvm (with ``profiles``) and tun, each 0666 in containers (CDI)."""
    kvm: dict[str, Any] = {"name": RESOURCE, "devices": ["/dev/kvm"], "cdi": {"file_mode": "0666"}}
    if profiles:
        kvm["restore_profiles"] = profiles
    tun = {"name": TUN, "devices": ["/dev/net/tun"], "units": 1024, "cdi": {"file_mode": "0666"}}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"deviceConfig": {"resources": [kvm, tun]}}, sort_keys=False))
    return str(path)


def template(profile: str) -> str:
    return f"restore-{profile.replace('_', '-')}"


def claim_templates() -> list[dict[str, Any]]:
    """The recorder's claim (kvm, any device), and per profile the worker's: kvm where the
    profile restores (docs/restore-placement.md's selector) and tun."""

    def kvm(selectors: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "name": "kvm",
            "exactly": {"deviceClassName": "kvm.ate.dev", **({"selectors": selectors} if selectors else {})},
        }

    def made(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": MICROVM_WORKERS},
                "spec": {"spec": {"devices": {"requests": requests}}}}  # fmt: skip

    tun = {"name": "tun", "exactly": {"deviceClassName": "tun.ate.dev"}}
    found = [made(RECORD_TEMPLATE, [kvm([])])]
    for p in PROFILES:
        selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].restore_{p} == true'}}
        found.append(made(template(p), [kvm([selector]), tun]))
    return found


def restoring(profile: str, name: str) -> dict[str, Any]:
    """The micro-VM worker whose claim asks a kvm device where ``profile`` restores."""
    pod = claiming(worker(name))
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template(profile)
    pod["metadata"]["labels"].update(PART_OF)
    return pod


@pytest.fixture(scope="module")
def release(cluster_137: Cluster, helm_137: Helm) -> Iterator[Cluster]:
    """The release in dra mode without profiles, each node's own kvm and net/tun nodes; the
    claim templates; uninstalled at the end."""
    cluster = cluster_137
    for node in cluster.nodes:
        node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}/net; mknod -m 0600 {PRIVATE_DEV}/kvm c 10 232; "
                  f"mknod -m 0600 {PRIVATE_DEV}/net/tun c 10 200"])  # fmt: skip
    try:
        start = time.monotonic()
        helm_137.install(*INSTALL, "-f", values(cluster.dir, "restore-none", None))
        print(f"helm install (dra, kvm and tun) returned after {time.monotonic() - start:.1f}s")
        ensure_workload_namespace(cluster)
        for obj in claim_templates():
            cluster.apply(obj)
        yield cluster
    finally:
        selector = ",".join(f"{k}={v}" for k, v in PART_OF.items())
        cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, "-l", selector, "--ignore-not-found", "--wait=true",
                        timeout=180, check=False)  # fmt: skip
        for obj in claim_templates():
            cluster.kubectl("delete", "resourceclaimtemplate", "-n", MICROVM_WORKERS, obj["metadata"]["name"],
                            "--ignore-not-found", check=False)  # fmt: skip
        if helm_137.run("status", RELEASE, "-n", NAMESPACE, check=False).returncode == 0:
            helm_137.uninstall()
        wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        for node in cluster.nodes:
            node.run(["rm", "-rf", PRIVATE_DEV])


def probe_passed(cluster: Cluster, daemon: dict[str, Any]) -> bool:
    return kvm_probe_states(cluster, daemon)["passed"] == 1


def daemons(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Each node's Ready daemon pod, by node name."""
    return {node.name: wait_plugin_ready(cluster, node) for node in cluster.nodes}


@pytest.fixture(scope="module")
def profiles(release: Cluster, helm_137: Helm) -> tuple[Profiles, dict[str, tuple[str, int]]]:
    """This node's profile recorded in a pod, the three profiles built of it and put in
    deviceConfig by ``helm upgrade``; with the daemon pods' (uid, restartCount) before it."""
    cluster = release
    for node_name, daemon in daemons(cluster).items():  # the answers need a passed probe: the prober's
        wait_until(f"{node_name}'s probe passed", partial(probe_passed, cluster, daemon), 180)
    pod = recorder_pod(f"record-{uuid.uuid4().hex[:6]}", MICROVM_WORKERS, RECORD_TEMPLATE)
    pod["metadata"]["labels"] = dict(PART_OF)
    text, node_name = record(cluster, pod)
    built = build(text, cluster.dir / "restore")
    print(f"ate-devplugin cpu-profile in a pod on {node_name} (uid 0, no capability, the claim's /dev/kvm):\n"
          f"{excerpt(text)}\nate-devplugin restore-profile --name here:\n{built.built[:400]}...")  # fmt: skip
    before = {name: identity(p) for name, p in daemons(cluster).items()}
    start = time.monotonic()
    helm_137.upgrade(*INSTALL, "-f", values(cluster.dir, "restore-three", built.profiles))
    print(f"helm upgrade with the three profiles returned after {time.monotonic() - start:.1f}s")
    return built, before


def restore_attributes(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    """The restore_* attributes of each of the node's kvm devices; the tun devices carry none."""
    slices = cluster.get_json("resourceslices")["items"]
    devices = [d for s in slices if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == node.name
               for d in s["spec"].get("devices", [])]  # fmt: skip
    found = []
    for device in devices:
        attrs = {k: next(iter(v.values())) for k, v in device.get("attributes", {}).items()}
        restore = {k: v for k, v in attrs.items() if k.startswith("restore_")}
        if attrs["resource"] == RESOURCE:
            found.append(restore)
        else:
            assert not restore, device
    return found


def answered(cluster: Cluster, node: Node, expected: dict[str, bool]) -> list[dict[str, Any]] | None:
    """The node's kvm devices once each says ``expected``."""
    want = {f"restore_{p}": v for p, v in expected.items()}
    found = restore_attributes(cluster, node)
    return found if found and all(a == want for a in found) else None


def test_the_answers_are_device_attributes_and_said_why(
    release: Cluster, profiles: tuple[Profiles, dict[str, tuple[str, int]]]
) -> None:
    cluster = release
    built, before = profiles
    start = time.monotonic()
    for node in cluster.nodes:
        devices = wait_until(f"{node.name}'s kvm devices answering", partial(answered, cluster, node, EXPECTED), 120)
        print(f"{node.name}: {len(devices)} kvm devices, each {devices[0]} ({time.monotonic() - start:.1f}s after "
              f"helm upgrade returned)")  # fmt: skip
    slices = cluster.get_json("resourceslices")["items"]
    device = next(d for s in slices if s["spec"]["driver"] == DRIVER for d in s["spec"]["devices"]
                  if d["attributes"]["resource"]["string"] == RESOURCE)  # fmt: skip
    attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    # The recorded profile is the one the daemon's prober learned of the same device.
    recorded = built.recorded
    assert (attrs["cpuVendor"], attrs["cpuModel"], attrs["kvmImplementation"]) == (
        recorded.vendor, recorded.model, recorded.kvm_implementation
    )  # fmt: skip
    shown = {
        k: device["attributes"][k]
        for k in ("cpuVendor", "cpuModel", "kvmImplementation", *[f"restore_{p}" for p in PROFILES])
    }
    print(f"kubectl get resourceslices: device {device['name']} attributes (of {len(attrs)}): {json.dumps(shown)}")
    for name, pod in daemons(cluster).items():
        assert identity(pod) == before[name], f"{name}'s daemon restarted: {identity(pod)} != {before[name]}"
        lines = said(cluster, pod)
        assert last_said(cluster, pod) == built.said(), lines
        assert sorted(lines) == sorted(built.said().values()), f"each said once: {lines}"
        got = answers(cluster, pod)
        assert got == {"here": "restorable", "one_more": "missing-features", "other_tsc": "tsc"}, got
        print(f"{name}'s /metrics:", *answer_lines(cluster, pod), sep="\n  ")
        print(f"{name}: daemon pod {pod['metadata']['name']} (uid, restarts) {identity(pod)} as before the upgrade; "
              f"its log: {lines}; ate_devplugin_kvm_restore_answer == 1: {got}")  # fmt: skip


def test_a_claim_selecting_a_restorable_profile_runs_its_vm_and_the_others_stay_pending(
    release: Cluster, profiles: tuple[Profiles, dict[str, tuple[str, int]]]
) -> None:
    cluster = release
    for node in cluster.nodes:
        wait_until(f"{node.name}'s kvm devices answering", partial(answered, cluster, node, EXPECTED), 120)
    pending = {
        p: restoring(p, f"restore-{p.replace('_', '-')}-{uuid.uuid4().hex[:6]}") for p in ("one_more", "other_tsc")
    }
    for pod in pending.values():
        cluster.apply(pod)
    try:
        run = run_pod(cluster, restoring("here", "restore-here"))
        booted_as_shipped(run, cluster.cgroup)
        print(f"restore_here == true: Succeeded on {run.node}")
        for profile, pod in pending.items():
            name = pod["metadata"]["name"]
            message = wait_until(f"{name} unschedulable", partial(unschedulable, cluster, MICROVM_WORKERS, name), 60)
            assert "cannot allocate all claims" in message, message
            got = cluster.get_json("pod", "-n", MICROVM_WORKERS, name)
            assert got["status"]["phase"] == "Pending", got["status"]
            assert not got["spec"].get("nodeName"), got["spec"]
            (claim,) = got["status"].get("resourceClaimStatuses", [])
            allocation = cluster.get_json("resourceclaim", "-n", MICROVM_WORKERS, claim["resourceClaimName"])
            assert "allocation" not in allocation.get("status", {})
            print(f"restore_{profile} == true: {name} Pending, PodScheduled False Unschedulable: {message!r}")
    finally:
        for pod in pending.values():
            cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, pod["metadata"]["name"], "--wait=false")


def test_a_changed_profile_flips_the_answer_without_a_restart(
    release: Cluster, helm_137: Helm, profiles: tuple[Profiles, dict[str, tuple[str, int]]]
) -> None:
    cluster = release
    built, _ = profiles
    pod = restoring("one_more", f"restore-one-more-{uuid.uuid4().hex[:6]}")
    name = pod["metadata"]["name"]
    cluster.apply(pod)
    try:
        wait_until(f"{name} unschedulable", partial(unschedulable, cluster, MICROVM_WORKERS, name), 60)
        before = {node: identity(p) for node, p in daemons(cluster).items()}
        start = time.monotonic()
        helm_137.upgrade(*INSTALL, "-f", values(cluster.dir, "restore-flipped", built.flipped()))
        flipped = {**EXPECTED, "one_more": True}
        for node in cluster.nodes:
            wait_until(f"{node.name}'s restore_one_more true", partial(answered, cluster, node, flipped), 120)
        to_flip = time.monotonic() - start
        for node_name, daemon in daemons(cluster).items():
            assert identity(daemon) == before[node_name], f"{node_name}'s daemon restarted"
            assert last_said(cluster, daemon)["one_more"] == "restore profile one_more: restorable"
            assert answers(cluster, daemon)["one_more"] == "restorable"
        run = finished(cluster, pod)
        booted_as_shipped(run, cluster.cgroup)
        print(f"helm upgrade dropping one_more's {built.lacking}: restore_one_more true on both nodes "
              f"{to_flip:.1f}s after it began, the same daemon pods {before}; log 'restore profile one_more: "
              f"restorable', the metric restorable; the Pending worker {name} ran on {run.node} "
              f"{time.monotonic() - start:.1f}s after")  # fmt: skip
    finally:
        cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, name, "--wait=false")
