"""The node's KVM facts as Node labels through the real node-feature-discovery
(docs/kvm-health.md, "As node labels (device-plugin mode)").

On the real 1.35 cluster (one node, containerd 1.6, cgroup v1), in device-plugin mode: the
chart with nfd.enabled (the prober on by default); its unprivileged daemon writes the feature file
from the prober's verdicts into the node directory the chart mounts (nfd.featuresDir); the
real nfd-worker (tools/build-nfd.sh; ``local`` sources only, as NFD's DaemonSet runs it,
its ``features.d`` that same node directory) and nfd-master (in the sandbox, as the control
plane's host, with the cluster's admin kubeconfig and the node as its NODE_NAME) put the labels
on the Node. The NodeFeature CRDs come from the pinned module's
deployment/ in the Go module cache; the worker runs as upstream's ``nfd-worker``
ServiceAccount with upstream's Role (deployment/base/rbac), so the rights it needs are the
ones NFD's own deployment grants.

Asserted: the Node's ``ate.dev/*`` labels are exactly the file's, and equal to what this
machine's own probe and node facts make of them (``kvmImplementation``, ``kvmHardware``, the
CPUID digest, ...); the node-affinity example of the docs: a pod requiring the other
``kvmHardware`` stays Pending with the scheduler's reason, one requiring the node's
``cpuidDigest`` is scheduled there and runs; the labels expire once the release is gone (the
daemon leaves its file, but nobody renews its +expiry-time). Printed: the times from the file
written to the labels on the Node, and from the uninstall to the labels gone (nfd.labelTtl 30 s
here, then one nfd-worker pass: its sleepInterval, 10 s here; NFD ships 60 s).

Restore placement (docs/restore-placement.md, tests/e2e/restore.py), before the uninstall:
this node's profile recorded in a pod granted ate.dev/kvm and three profiles built of it put
in deviceConfig by ``helm upgrade``; the Node's ``ate.dev/restore_<name>`` labels say
``here`` true, ``one_more`` (a feature this KVM lacks) and ``other_tsc`` false, the same
daemon logs why once and its metric says ``missing-features`` and ``tsc``; the micro-VM
worker requiring ``restore_here`` boots its guest, those requiring the others stay Pending
with the scheduler's reason; an edited ConfigMap makes ``one_more`` restorable without a
restart, its label turns true and its Pending worker boots.

Private paths only: the node's features.d is a directory of the node's tmpfs; nfd-worker, which
reads the fixed ``/etc/kubernetes/node-feature-discovery/features.d``, sees that directory
there through a bind mount in a mount namespace of its own, over an overlay of ``/etc``
(as NFD's DaemonSet mounts the host's directory at that path): the host's ``/etc`` is never
written. The module removes its release, NFD's objects and the labels at the end.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from ate_devplugin.kvm import nfd as feature_file
from ate_devplugin.kvm.attributes import attributes
from ate_devplugin.kvm.facts import read_node_facts
from ate_devplugin.kvm.probe import check
from tests.e2e.cluster import API, Cluster, Node, wait_until
from tests.e2e.clusters import required
from tests.e2e.restore import (
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
from tests.e2e.sandbox import Process
from tests.e2e.userpath import (
    CHART,
    MICROVM_WORKERS,
    NAMESPACE,
    RELEASE,
    TUN,
    WORKLOADS,
    Helm,
    booted_as_shipped,
    ensure_workload_namespace,
    example_pod,
    finished,
    run_pod,
    wait_plugin_ready,
    worker,
)
from tests.harness import nfd
from tests.harness.net import free_port

PRIVATE = "/run/ate-e2e-nfd"  # in the node's tmpfs: nothing of the host's is touched
PRIVATE_DEV = f"{PRIVATE}/dev"  # the daemon's device root (hostPaths.dev), as test_kvm_prober.py
KVM = f"{PRIVATE_DEV}/kvm"
FEATURES_DIR = f"{PRIVATE}/features.d"  # nfd.featuresDir: the node's directory the chart mounts
FEATURE_FILE = f"{FEATURES_DIR}/{feature_file.FILE_NAME}"
NFD_NAMESPACE = "node-feature-discovery"  # upstream's (deployment/overlays/default)
WORKER_PORT = 18081  # nfd-worker's /metrics and /healthz in the node's network namespace
# nfd-worker's core.sleepInterval: a pass at start, then every this long. NFD ships 60 s; the
# module sets 10 s (its passes are most of its time), which changes when, not what, it labels.
SLEEP_INTERVAL_S = 10
LABEL_TTL_S = 30  # nfd.labelTtl: the daemon renews the labels' expiry every 10 s
DOMAIN = "ate.dev"

# nfd-worker in a mount namespace of its own: /etc an overlay (its upper layer in the node's
# tmpfs, so the host's /etc stays unwritten), NFD's fixed features.d the node's directory.
WORKER_WRAPPER = """
mkdir -p {root}/etc-upper {root}/etc-work
mount -t overlay ate-e2e-nfd -o lowerdir=/etc,upperdir={root}/etc-upper,workdir={root}/etc-work /etc
mkdir -p {standard}
mount --bind {features} {standard}
exec "$@"
"""


@dataclass
class Nfd:
    """nfd-master and nfd-worker running beside the cluster."""

    master: Process
    worker: Process


def _rbac_objects(module: Path) -> list[dict[str, Any]]:
    """Upstream's deployment/base/rbac in NFD's namespace, as its kustomize overlay makes it."""
    objects: list[dict[str, Any]] = []
    base = module / "deployment" / "base" / "rbac"
    for name in yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]:
        for obj in yaml.safe_load_all((base / name).read_text()):
            if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                obj["metadata"]["namespace"] = NFD_NAMESPACE
            for subject in obj.get("subjects", []):
                subject["namespace"] = NFD_NAMESPACE
            objects.append(obj)
    return objects


def _token_kubeconfig(cluster: Cluster, account: str, path: Path) -> Path:
    """A kubeconfig of ``account``'s token (kubectl create token), as its pod would have."""
    token = cluster.kubectl("create", "token", account, "-n", NFD_NAMESPACE, "--duration=2h")
    assert token, f"no token for {account}"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": API, "certificate-authority": str(cluster.pki / "ca.crt")}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": account}}],
        "current-context": "e2e",
    }))  # fmt: skip
    return path


def _ate_labels(node: Node) -> dict[str, str]:
    labels: dict[str, str] = node.get()["metadata"].get("labels", {})
    return {k: v for k, v in labels.items() if k.startswith(f"{DOMAIN}/")}


def _labels_with_digest(node: Node) -> dict[str, str]:
    """The Node's ate.dev labels once the digest is among them (one worker pass, and more)."""

    def found() -> dict[str, str] | None:
        labels = _ate_labels(node)
        return labels if f"{DOMAIN}/cpuidDigest" in labels else None

    return wait_until("ate.dev/cpuidDigest on the Node", found, SLEEP_INTERVAL_S + 60)


def _file(node: Node) -> tuple[dict[str, str], float] | None:
    """The feature file's labels and its modification time (None: not there)."""
    out = node.run(["python3", "-c", "import os, sys; p = sys.argv[1]; print(os.stat(p).st_mtime); "
                    "print(open(p).read(), end='')", FEATURE_FILE], check=False)  # fmt: skip
    if out.returncode != 0:
        return None
    mtime, _, text = out.stdout.partition("\n")
    labels = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return labels, float(mtime)


@pytest.fixture(scope="module")
def nfd_running(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nfd]:
    """NFD's CRDs, namespace and worker RBAC applied; nfd-master in the sandbox, nfd-worker on
    the node; all of it removed at the end, the labels it set too."""
    why = nfd.missing()
    if why:
        if required():
            pytest.fail(f"{why} (CI=true or E2E_REQUIRED=1)")
        pytest.skip(why)
    module = nfd.module_dir()
    assert module is not None
    master_bin, worker_bin = nfd.binary("nfd-master"), nfd.binary("nfd-worker")
    assert master_bin is not None
    assert worker_bin is not None
    work = tmp_path_factory.mktemp("nfd")
    node = cluster.node
    crds = module / nfd.CRDS
    started: list[Process] = []
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "-f", str(crds), "--timeout=60s", timeout=90)
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NFD_NAMESPACE}})
        for obj in _rbac_objects(module):
            cluster.apply(obj)
        env = {**os.environ, "KUBERNETES_NAMESPACE": NFD_NAMESPACE}
        port = cluster.sandbox.in_netns(free_port)
        # NODE_NAME: the node its Deployment's pod would run on (it annotates that Node with
        # its version at start, and exits when there is none).
        master = cluster.sandbox.spawn("nfd-master", [
            str(master_bin), f"-kubeconfig={cluster.kubeconfig}", f"-port={port}",
        ], env={**env, "NODE_NAME": node.name})  # fmt: skip
        started.append(master)
        health = f"http://127.0.0.1:{port}/healthz"
        wait_until("nfd-master's /healthz", lambda: master.running() and cluster.sandbox.http_get(health)[0] == 200, 60)
        worker_config = _token_kubeconfig(cluster, "nfd-worker", work / "nfd-worker.kubeconfig")
        node.run(["mkdir", "-p", FEATURES_DIR])
        wrapper = WORKER_WRAPPER.format(root=PRIVATE, standard=feature_file.FEATURES_DIR, features=FEATURES_DIR)
        worker = node.spawn("nfd-worker", [
            "unshare", "--mount", "--propagation", "private", "sh", "-ec", wrapper, "nfd-worker",
            str(worker_bin), f"-kubeconfig={worker_config}", f"-port={WORKER_PORT}",
            "-feature-sources=local", "-label-sources=local", "-no-owner-refs",
            f'-options={{"core": {{"sleepInterval": "{SLEEP_INTERVAL_S}s"}}}}',
        ], env={**env, "NODE_NAME": node.name})  # fmt: skip
        started.append(worker)
        # Its first pass made the node's NodeFeature (no feature file yet: no labels of ours).
        wait_until("nfd-worker's NodeFeature", lambda: cluster.get_json(
            "nodefeatures.nfd.k8s-sigs.io", "-n", NFD_NAMESPACE, node.name, check=False), 60)  # fmt: skip
        print(f"node-feature-discovery {nfd.version()}: nfd-master (admin kubeconfig), nfd-worker (ServiceAccount "
              f"nfd-worker, upstream's Role) on {node.name}, sleepInterval {SLEEP_INTERVAL_S}s")  # fmt: skip
        yield Nfd(master, worker)
    finally:
        for proc in reversed(started):
            state = "running" if proc.running() else f"exited {proc.popen.returncode}"
            print(f"{proc.name} ({state}), its log's tail:\n{proc.log_tail(1500)}")
            proc.stop()
            cluster.sandbox.processes.remove(proc)
        cluster.kubectl("delete", "namespace", NFD_NAMESPACE, "--ignore-not-found", "--timeout=60s", check=False)
        cluster.kubectl("delete", "-f", str(crds), "--ignore-not-found", "--timeout=60s", check=False)
        for obj in _rbac_objects(module):
            if obj["kind"].startswith("Cluster"):
                cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)
        left = node.get()["metadata"]
        ours = {k: None for k in left.get("labels", {}) if k.startswith(f"{DOMAIN}/")}
        if ours:
            node.label(ours)
        annotations = [f"{k}-" for k in left.get("annotations", {}) if k.startswith("nfd.node.kubernetes.io/")]
        if annotations:
            cluster.kubectl("annotate", "node", node.name, *annotations, check=False)
        node.run(["rm", "-rf", PRIVATE])


@pytest.fixture(scope="module")
def release(cluster: Cluster, helm: Helm, nfd_running: Nfd) -> Iterator[Cluster]:
    """The chart with the prober and the feature file, its features.d the node's private one."""
    node = cluster.node
    # The prober is on by default (uid 0, it opens the node's 0600 /dev/kvm); the daemon
    # watches a private node. The labels live LABEL_TTL_S past the daemon's last renewal.
    node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {KVM} c 10 232"])
    try:
        helm.install("--set", f"hostPaths.dev={PRIVATE_DEV}", "--set", "nfd.enabled=true",
                     "--set", f"nfd.featuresDir={FEATURES_DIR}", "--set", f"nfd.labelTtl={LABEL_TTL_S}")  # fmt: skip
        yield cluster
    finally:
        if helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            helm.uninstall()
        wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
        node.run(["rm", "-rf", PRIVATE_DEV])


def _expected() -> dict[str, str]:
    """What this machine's own probe of /dev/kvm and node facts make of the labels: the test
    process, root on the host, probes the device the prober pod was granted."""
    result = check("/dev/kvm", 5.0)
    assert result.passed, result
    assert result.device_facts is not None, result
    device = result.device_facts
    return feature_file.labels(attributes(read_node_facts(), device), device.cpu_features, DOMAIN)


def test_the_facts_reach_the_node_as_labels(release: Cluster) -> None:
    cluster = release
    node = cluster.node
    wait_plugin_ready(cluster, node)
    expected = _expected()
    digest = expected[f"{DOMAIN}/cpuidDigest"]
    # The daemon writes the node's facts at the first verdict, the device's once the prober's
    # probe passed: wait for the file that holds the digest.

    def with_digest() -> tuple[dict[str, str], float] | None:
        found = _file(node)
        return found if found is not None and f"{DOMAIN}/cpuidDigest" in found[0] else None

    file_labels, mtime = wait_until("the feature file with the probe's CPUID digest", with_digest, 180)
    at = time.strftime("%H:%M:%S", time.gmtime(mtime))
    print(f"{FEATURE_FILE} on {node.name}: {len(file_labels)} labels, written at {at}")
    try:
        _labels_with_digest(node)
    except Exception:
        print(f"NodeFeature: {cluster.kubectl('get', 'nodefeatures', '-n', NFD_NAMESPACE, '-o', 'yaml', check=False)}")
        raise
    seen = time.time()
    # Written at mtime, on the Node at most one worker pass later, plus nfd-master's update.
    print(f"file written -> ate.dev/cpuidDigest on the Node: {seen - mtime:.1f}s "
          f"(nfd-worker reads features.d every {SLEEP_INTERVAL_S}s; polled every 0.5s)")  # fmt: skip
    assert seen - mtime < SLEEP_INTERVAL_S + 30, "longer than one nfd-worker pass"
    labels = _ate_labels(node)  # nfd-master writes them in one update: all there now
    assert labels[f"{DOMAIN}/kvmImplementation"] == expected[f"{DOMAIN}/kvmImplementation"]
    assert labels[f"{DOMAIN}/kvmHardware"] == expected[f"{DOMAIN}/kvmHardware"]
    assert labels[f"{DOMAIN}/cpuidDigest"] == digest
    print(f"Node {node.name}: kvmImplementation={labels[f'{DOMAIN}/kvmImplementation']} kvmHardware="
          f"{labels[f'{DOMAIN}/kvmHardware']} cpuidDigest={digest}, {len(labels)} ate.dev labels")  # fmt: skip
    # Exactly the file's labels, and what this machine's own probe says: the unprivileged
    # daemon and its prober pod read the same facts as root on the host.
    assert labels == file_labels, {k: (labels.get(k), file_labels.get(k)) for k in labels.keys() | file_labels.keys()
                                   if labels.get(k) != file_labels.get(k)}  # fmt: skip
    assert labels == expected, {k: (labels.get(k), expected.get(k)) for k in labels.keys() | expected.keys()
                                if labels.get(k) != expected.get(k)}  # fmt: skip


def _affinity_pod(name: str, key: str, value: str, node: Node) -> dict[str, Any]:
    """The example consumer pod with the docs' required node affinity on ``key``."""
    pod = example_pod(name)
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}],
    }}}  # fmt: skip
    return pod


def test_node_affinity_on_the_labels(release: Cluster) -> None:
    cluster = release
    node = cluster.node
    labels = _labels_with_digest(node)
    ensure_workload_namespace(cluster)
    # The other kvmHardware than this node's (the docs' `true` on this PVM machine): Pending.
    other = "false" if labels[f"{DOMAIN}/kvmHardware"] == "true" else "true"
    pending = _affinity_pod(f"needs-kvm-hardware-{uuid.uuid4().hex[:6]}", f"{DOMAIN}/kvmHardware", other, node)
    name = pending["metadata"]["name"]
    cluster.apply(pending)
    try:

        def unschedulable() -> dict[str, Any] | None:
            status = cluster.get_json("pod", "-n", WORKLOADS, name)["status"]
            cond = next((c for c in status.get("conditions", []) if c["type"] == "PodScheduled"), None)
            return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None

        cond = wait_until(f"pod {name} Unschedulable", unschedulable, 60)
        print(f"kvmHardware In [{other}]: Pending, {cond['reason']}: {cond['message']}")
        assert "didn't match Pod's node affinity/selector" in cond["message"], cond

        # The node's own digest: scheduled there, and the pod's check of /dev/kvm runs.
        digest = labels[f"{DOMAIN}/cpuidDigest"]
        ran = run_pod(cluster, _affinity_pod("same-cpu", f"{DOMAIN}/cpuidDigest", digest, node))
        print(f"cpuidDigest In [{digest}]: {ran.phase} on {ran.node}, exit {ran.exit_code}: {ran.logs.strip()}")
        assert (ran.phase, ran.exit_code, ran.node) == ("Succeeded", 0, node.name), ran
        assert ran.logs.startswith("kvm ok"), ran.logs

        still = cluster.get_json("pod", "-n", WORKLOADS, name)
        assert still["status"]["phase"] == "Pending", still["status"]
        assert not still["spec"].get("nodeName"), still["spec"]
    finally:
        cluster.kubectl("delete", "pod", "-n", WORKLOADS, name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def restore_profiles(release: Cluster, helm: Helm) -> tuple[Profiles, tuple[str, int]]:
    """docs/restore-placement.md in device-plugin mode: this node's profile recorded in a pod
    granted one unit of ate.dev/kvm, the three profiles of tests/e2e/restore.py added by
    ``helm upgrade`` (the values as installed; the chart's kvm resource with the profiles, and
    ate.dev/tun for the micro-VM worker); with the daemon pod's (uid, restartCount) before it."""
    cluster = release
    node = cluster.node
    node.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}/net; mknod -m 0600 {PRIVATE_DEV}/net/tun c 10 200"])
    ensure_workload_namespace(cluster)
    text, _ = record(cluster, recorder_pod(f"record-{uuid.uuid4().hex[:6]}", MICROVM_WORKERS))
    built = build(text, cluster.dir / "restore-nfd")
    print(f"ate-devplugin cpu-profile in a pod granted ate.dev/kvm (uid 0, no capability):\n{excerpt(text)}")
    installed = cluster.dir / "restore-nfd" / "installed.json"
    installed.write_text(helm.run("get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    (kvm,) = yaml.safe_load((CHART / "values.yaml").read_text())["deviceConfig"]["resources"]  # as installed
    resources = [{**kvm, "restore_profiles": built.profiles}, {"name": TUN, "devices": ["/dev/net/tun"], "units": 1024}]
    profiles = cluster.dir / "restore-nfd" / "profiles.yaml"
    profiles.write_text(yaml.safe_dump({"deviceConfig": {"resources": resources}}, sort_keys=False))
    before = identity(wait_plugin_ready(cluster, node))
    helm.upgrade("-f", str(installed), "-f", str(profiles))
    return built, before


def _restore_worker(profile: str) -> dict[str, Any]:
    """The micro-VM worker, required on a node whose label says it restores ``profile``."""
    pod = worker(f"restore-{profile.replace('_', '-')}-{uuid.uuid4().hex[:6]}")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": f"{DOMAIN}/restore_{profile}", "operator": "In", "values": ["true"]}]}],
    }}}  # fmt: skip
    return pod


def _restore_labels(node: Node, expected: dict[str, str]) -> dict[str, str] | None:
    labels = _ate_labels(node)
    return labels if all(labels.get(f"{DOMAIN}/restore_{p}") == v for p, v in expected.items()) else None


def test_restore_profiles_become_labels_that_place_the_worker(
    release: Cluster, restore_profiles: tuple[Profiles, tuple[str, int]]
) -> None:
    cluster = release
    node = cluster.node
    built, before = restore_profiles
    start = time.monotonic()
    expected = {"here": "true", "one_more": "false", "other_tsc": "false"}
    labels = wait_until("the restore labels on the Node", partial(_restore_labels, node, expected),
                        SLEEP_INTERVAL_S + 90)  # fmt: skip
    restore = {k: v for k, v in labels.items() if k.startswith(f"{DOMAIN}/restore_")}
    print(f"Node {node.name}'s labels {time.monotonic() - start:.1f}s after helm upgrade: {restore}; and "
          f"{({k: labels[f'{DOMAIN}/{k}'] for k in ('cpuVendor', 'cpuModel', 'kvmImplementation')})}")  # fmt: skip
    found = _file(node)
    assert found is not None
    assert {k: v for k, v in found[0].items() if k.startswith(f"{DOMAIN}/restore_")} == restore
    daemon = wait_plugin_ready(cluster, node)
    assert identity(daemon) == before, "the daemon restarted"
    lines = said(cluster, daemon)
    assert last_said(cluster, daemon) == built.said(), lines
    assert sorted(lines) == sorted(built.said().values()), f"each said once: {lines}"
    got = answers(cluster, daemon)
    assert got == {"here": "restorable", "one_more": "missing-features", "other_tsc": "tsc"}, got
    print("the daemon's /metrics:", *answer_lines(cluster, daemon), sep="\n  ")
    print(f"daemon pod (uid, restarts) {before} as before the upgrade; its log: {lines}; "
          f"ate_devplugin_kvm_restore_answer == 1: {got}")  # fmt: skip
    pending = [_restore_worker("one_more"), _restore_worker("other_tsc")]
    for pod in pending:
        cluster.apply(pod)
    try:
        run = run_pod(cluster, _restore_worker("here"))
        booted_as_shipped(run, cluster.cgroup)
        assert run.node == node.name
        for pod in pending:
            name = pod["metadata"]["name"]
            message = wait_until(f"{name} unschedulable", partial(unschedulable, cluster, MICROVM_WORKERS, name), 60)
            assert "didn't match Pod's node affinity/selector" in message, message
            assert cluster.get_json("pod", "-n", MICROVM_WORKERS, name)["status"]["phase"] == "Pending"
            print(f"{name}: Pending, PodScheduled False Unschedulable: {message!r}")
    finally:
        for pod in pending:
            cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, pod["metadata"]["name"], "--wait=false")


def test_a_changed_restore_profile_flips_its_label_without_a_restart(
    release: Cluster, restore_profiles: tuple[Profiles, tuple[str, int]]
) -> None:
    """The ConfigMap edited (as with deviceConfig.existingConfigMap): one_more without its
    extra feature. The same daemon answers it, nfd-worker's next pass relabels the Node,
    and the worker Pending on it is scheduled and boots."""
    cluster = release
    node = cluster.node
    built, _ = restore_profiles
    pod = _restore_worker("one_more")
    name = pod["metadata"]["name"]
    cluster.apply(pod)
    try:
        wait_until(f"{name} unschedulable", partial(unschedulable, cluster, MICROVM_WORKERS, name), 60)
        daemon = wait_plugin_ready(cluster, node)
        before = identity(daemon)
        config_map = cluster.get_json("configmap", "-n", NAMESPACE, RELEASE)
        config = yaml.safe_load(config_map["data"]["config.yaml"])
        (kvm,) = [r for r in config["resources"] if "restore_profiles" in r]
        kvm["restore_profiles"] = built.flipped()
        config_map["data"]["config.yaml"] = yaml.safe_dump(config, sort_keys=False)
        start = time.monotonic()
        cluster.kubectl("replace", "-f", "-", stdin=json.dumps(config_map))
        wait_until("the daemon's answer", lambda: answers(cluster, daemon).get("one_more") == "restorable", 120)
        answered = time.monotonic() - start
        wait_until("restore_one_more=true on the Node", partial(_restore_labels, node, {"one_more": "true"}),
                   SLEEP_INTERVAL_S + 60)  # fmt: skip
        labelled = time.monotonic() - start
        assert identity(wait_plugin_ready(cluster, node)) == before, "the daemon restarted"
        assert last_said(cluster, daemon)["one_more"] == "restore profile one_more: restorable"
        run = finished(cluster, pod)
        booted_as_shipped(run, cluster.cgroup)
        print(f"ConfigMap edited (one_more without {built.lacking}): the same daemon {before} answered restorable "
              f"after {answered:.1f}s, the Node's label true after {labelled:.1f}s, the Pending worker {name} ran "
              f"on {run.node} after {time.monotonic() - start:.1f}s")  # fmt: skip
    finally:
        cluster.kubectl("delete", "pod", "-n", MICROVM_WORKERS, name, "--wait=false")


def test_the_labels_expire_once_the_release_is_gone(release: Cluster, helm: Helm) -> None:
    """The daemon leaves the file at stop (a restarted or rolled daemon renews it), but its
    labels carry an expiry time it renews every third of nfd.labelTtl: with the release
    uninstalled nobody renews it, and nfd-worker's first pass past that time drops them, the
    file itself still there."""
    cluster = release
    node = cluster.node
    before = _ate_labels(node)
    assert before, "the labels are there to begin with"
    written = _file(node)
    assert written is not None
    expiry = _expiry(node)
    assert expiry is not None, "the file carries +expiry-time"
    helm.uninstall()
    start = time.time()
    wait_until("the release's pods gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    left = _file(node)
    assert left is not None, "the daemon left its feature file"
    assert left[0] == before
    wait_until(
        "the ate.dev labels gone from the Node", lambda: not _ate_labels(node), LABEL_TTL_S + SLEEP_INTERVAL_S + 60
    )
    assert _file(node) is not None  # gone by their expiry, not by the file's removal
    print(
        f"release uninstalled: the file left ({_expiry(node)}), the {len(before)} ate.dev labels gone from the "
        f"Node {time.time() - start:.1f}s later (nfd.labelTtl {LABEL_TTL_S} s, nfd-worker every {SLEEP_INTERVAL_S} s)"
    )


def _expiry(node: Node) -> str | None:
    text = node.run(["cat", FEATURE_FILE], check=False).stdout
    return next((line for line in text.splitlines() if line.startswith("# +expiry-time=")), None)


def test_the_worker_and_master_stayed_up(nfd_running: Nfd) -> None:
    for proc in (nfd_running.master, nfd_running.worker):
        assert proc.running(), f"{proc.name} exited:\n{proc.log_tail()}"
