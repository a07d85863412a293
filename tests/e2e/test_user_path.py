"""The user's path on a real cluster: the release published by tools/release.sh to a real
OCI registry, ``helm install`` of it with the very commands chart/README.md prints, the
nodes pulling the image from the registry, the device-only example pod, the micro-VM
worker preset and QEMU booting a guest with a NIC in an unprivileged pod
(docs/examples/microvm-worker-pod.yaml, tests/e2e/vmm.py), a kubelet restart, a plugin pod
replaced, ``helm upgrade``, ``helm uninstall``, and a real Prometheus scraping the plugin
through service discovery.

It runs on two clusters (the ``user_cluster`` parameter): Kubernetes 1.35 with one node on
Debian's containerd 1.6 and cgroup v1, every test; and 1.37 with two nodes on containerd 2
and cgroup v2, the tests marked ``every_release``: what the kubelet and the API server of a release decide. The
chart's own checks, the runtime's settings and the dashboards run once, on 1.35. On two
nodes the DaemonSet runs on both and every node is checked; a disruptive scenario acts on
the last node, and the first one is checked to go on undisturbed.

Each cluster gets a registry of its own (tests/e2e/registry.py serves ``ghcr.io`` in its
sandbox) and the release published there. The tests of each cluster run in file order and
share one release (installed with helm v3 by the first test, removed by the uninstall
test); helm v4 installs and uninstalls it once more at the end. Every install and upgrade
names the published chart, and none sets an image: the chart's default,
``ghcr.io/ate-dev/ate-devplugin:<version>``, is what every node pulls. Each test asserts
what the user would check with kubectl, curl and Prometheus.

The node's allocatable lags the plugin pod's Ready by up to the kubelet's node status
period (10 s by default): every test waits on allocatable itself, never on Ready alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import re
import signal
import stat
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import (
    API,
    API_PORT,
    API_SERVICE_IP,
    CONTAINERD2,
    DEBIAN_CONTAINERD,
    GATEWAY,
    Cluster,
    ClusterError,
    Node,
    wait_until,
)
from tests.e2e.clusters import Clusters
from tests.e2e.monitoring import (
    SandboxPrometheus,
    dashboard_queries,
    dashboard_values,
    fill,
    rendered_rules,
    scraping,
)
from tests.e2e.registry import Registry, serving
from tests.e2e.userpath import (
    CHART,
    NAMESPACE,
    PLUGIN_SELECTOR,
    RELEASE,
    RESOURCE,
    TEST_SELECTOR,
    TUN,
    Helm,
    booted_as_shipped,
    ensure_namespace,
    ensure_workload_namespace,
    example_pod,
    helm_test_passed,
    is_ready,
    make_helm,
    metrics,
    plugin_pods,
    run_pod,
    sample,
    wait_plugin_ready,
    watch_exit_code,
    watching,
    worker,
)
from tests.e2e.vmm import NO_KVM, WORKER_VALUES
from tests.harness.chart import doc_block, helm_path, prometheus_operator_crds
from tests.harness.image import BuiltImage, buildah
from tests.harness.monitoring import reads_dra, reads_pod_resources

REPO = Path(__file__).resolve().parents[2]
#: A group for the device node of scenario 3b (kvm's fixed GID on Fedora and RHEL).
KVM_GID = 36
PROBER = f"{RESOURCE}-prober"  # the KVM prober's resource, served beside ate.dev/kvm
QEMU_EACCES = "Could not access KVM kernel module: Permission denied"
#: docs/examples/microvm-worker-values.yaml: its resources, its units of ate.dev/tun, and
#: the device nodes of two of them that these machines lack (no vhost modules).
PRESET_RESOURCES = [r["name"] for r in yaml.safe_load(WORKER_VALUES.read_text())["deviceConfig"]["resources"]]
TUN_UNITS = next(r["units"] for r in yaml.safe_load(WORKER_VALUES.read_text())["deviceConfig"]["resources"]
                 if r["name"] == TUN)  # fmt: skip
ABSENT_DEVICES = ("/dev/vhost-net", "/dev/vhost-vsock")
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
PUBLISHED_CHART = "oci://ghcr.io/ate-dev/charts/ate-devplugin"
IMAGE_REPOSITORY = "ate-dev/ate-devplugin"
PUBLISHED_IMAGE = f"ghcr.io/{IMAGE_REPOSITORY}:{VERSION}"
#: The clusters the path runs on: (release, runtime, nodes, cgroup version).
USER_CLUSTERS = {"k8s1.35": ("1.35", DEBIAN_CONTAINERD, 1, 1), "k8s1.37-2nodes": ("1.37", CONTAINERD2, 2, 2)}
every_release = pytest.mark.every_release


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "user_cluster" in metafunc.fixturenames:
        kinds = list(USER_CLUSTERS) if metafunc.definition.get_closest_marker("every_release") else ["k8s1.35"]
        metafunc.parametrize("user_cluster", kinds, indirect=True, scope="module")


@pytest.fixture(scope="module")
def user_cluster(request: pytest.FixtureRequest, clusters: Clusters) -> Iterator[Cluster]:
    """The cluster of this parameter. On /dev/kvm 0600 root:root the README's non-root pod
    needs containerd's device ownership: turned on where the cluster has it off
    (containerd 2), for this module only."""
    cluster = clusters.get(*USER_CLUSTERS[request.param])
    changed = [node for node in cluster.nodes if not node.device_ownership]
    for node in changed:
        node.restart_containerd(device_ownership=True)
    try:
        yield cluster
    finally:
        for node in changed:
            node.restart_containerd(device_ownership=False)


# --- 0. the release, published as tools/release.sh publishes it ------------------------------


@pytest.fixture(scope="module")
def registry(user_cluster: Cluster) -> Iterator[Registry]:
    """The OCI registry of tests/e2e/registry.py in the cluster's sandbox, known to every
    node's containerd, for this cluster's part of the module."""
    with serving(user_cluster, user_cluster.dir / "registry") as registry:
        yield registry


def release(cluster: Cluster, registry: Registry, image: BuiltImage, path: str) -> str:
    """``REGISTRY=<path> tools/release.sh --push-only VERSION``: the session's image (built
    by tools/build-image.sh), labelled, under the release's name there, pushed by buildah,
    and the chart packaged and pushed by `helm push`."""
    helm_v3 = helm_path("v3")
    assert helm_v3 is not None
    home = cluster.dir / "release-helm"
    name = f"{path}/ate-devplugin:{VERSION}"
    # The session's image with one label more, so its own image ID: the kubelet
    # (KubeletEnsureSecretPulledImages, on in 1.35 and 1.37) checks pull credentials for
    # every name of an image ID it has pulled, so a pull of the very image the node has
    # preloaded under localhost/ate-devplugin:e2e would refuse that name to pods with
    # pullPolicy Never.
    container = buildah("from", "--pull-never", image.name).stdout.strip()
    try:
        buildah("config", "--label", f"io.ate-devplugin.e2e.published-as={path}", container)
        buildah("commit", "--quiet", container, name, timeout=600)
    finally:
        buildah("rm", container, check=False)
    try:
        out = registry.run_outside(
            [str(REPO / "tools" / "release.sh"), "--push-only", VERSION],
            env={"REGISTRY": path, "HELM": str(helm_v3), "HELM_CACHE_HOME": f"{home}/cache",
                 "HELM_CONFIG_HOME": f"{home}/config", "HELM_DATA_HOME": f"{home}/data"},
        )  # fmt: skip
    finally:
        buildah("rmi", name, check=False)
    return out.stdout


@pytest.fixture(scope="module")
def published(user_cluster: Cluster, registry: Registry, image: BuiltImage) -> str:
    """The release as the documentation names it: ghcr.io/ate-dev."""
    out = release(user_cluster, registry, image, "ghcr.io/ate-dev")
    assert registry.tags(IMAGE_REPOSITORY) == [VERSION]
    assert registry.tags("ate-dev/charts/ate-devplugin") == [VERSION]
    assert f"helm install ate-devplugin {PUBLISHED_CHART} --version {VERSION}" in out
    return out


def users_helm(major: str, cluster: Cluster, registry: Registry) -> Helm:
    """helm ``major`` as the user runs it: the published chart, the chart's default image."""
    return dataclasses.replace(
        make_helm(major, cluster), chart=(PUBLISHED_CHART, "--version", VERSION), image_values=(),
        env=registry.client_env(),
    )  # fmt: skip


@pytest.fixture(scope="module")
def user_helm(user_cluster: Cluster, registry: Registry, published: str) -> Helm:
    return users_helm("v3", user_cluster, registry)


def last(cluster: Cluster) -> Node:
    """The node a disruptive scenario acts on (the second of two)."""
    return cluster.nodes[-1]


def node_images(node: Node) -> list[str]:
    return node.ctr("images", "ls", "-q").stdout.split()


@pytest.fixture(scope="module")
def installed(user_cluster: Cluster, user_helm: Helm) -> Iterator[dict[str, Any]]:
    """chart/README.md's install commands, run as they are with helm v3; uninstalled at the
    end if a test did not do it. The namespace exists beforehand enforcing Pod Security's
    `baseline`, as one that `--create-namespace` makes on a cluster whose default is baseline:
    the documented commands must turn it privileged."""
    for node in user_cluster.nodes:
        preloaded = [i for i in node_images(node) if i.startswith("ghcr.io/")]
        assert not preloaded, f"nothing of the release preloaded on {node.name}"
    ensure_namespace(user_cluster, NAMESPACE, "baseline")
    start = time.monotonic()
    out = user_helm.shell(doc_block("install"), user_cluster.dir)
    ready = [is_ready(p) for p in plugin_pods(user_cluster)]
    record = {"notes": out.stdout, "helm_seconds": time.monotonic() - start, "ready_when_helm_returned": ready}
    try:
        yield record
    finally:
        if user_helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            user_helm.uninstall()


def registered(cluster: Cluster, pod: dict[str, Any], resource: str = RESOURCE) -> float | None:
    return sample(metrics(cluster, pod), "ate_devplugin_registered", resource_name=resource)


def only_plugin_pod(cluster: Cluster, node: Node) -> dict[str, Any]:
    (pod,) = plugin_pods(cluster, node)
    return pod


# --- 1. helm install ---------------------------------------------------------------------


def pod_security(cluster: Cluster, namespace: str = NAMESPACE) -> str | None:
    labels: dict[str, str] = cluster.get_json("namespace", namespace)["metadata"].get("labels", {})
    return labels.get("pod-security.kubernetes.io/enforce")


def rollout(docs: list[dict[str, Any]]) -> tuple[int, bool]:
    """The plugin DaemonSet's maxSurge and whether its pods name their sockets with their UID."""
    (ds,) = [d for d in docs if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == RELEASE]  # not its prober
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], "--socket-suffix=$(K8S_POD_UID)" in args


@every_release
def test_helm_install_makes_the_node_offer_kvm(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """The documented install, in a namespace that enforced baseline before it: the commands
    label it privileged. What only 1.37 takes (sockets named with the pod's UID, maxSurge 1)
    follows this cluster's release, as helm learns it at install and with `helm template
    --validate`; plain `helm template`, which cannot know it, renders what every release takes."""
    assert "rollout status daemonset/ate-devplugin" in installed["notes"], "NOTES say what to wait on"
    assert pod_security(user_cluster) == "privileged"
    newest = tuple(map(int, user_cluster.release.split("."))) >= (1, 37)
    installed_docs = list(yaml.safe_load_all(user_helm.run("get", "manifest", RELEASE, "-n", NAMESPACE).stdout))
    chart = (*user_helm.chart, "-n", NAMESPACE)
    validated = list(yaml.safe_load_all(user_helm.run("template", RELEASE, *chart, "--validate").stdout))
    offline = list(yaml.safe_load_all(user_helm.run("template", RELEASE, *chart).stdout))
    renders = {"install": rollout(installed_docs), "template --validate": rollout(validated),
               "template": rollout(offline)}  # fmt: skip
    print(f"{user_cluster.release}: maxSurge and socket suffix per render: {renders}")
    assert renders == {"install": (int(newest), newest), "template --validate": (int(newest), newest),
                       "template": (0, False)}  # fmt: skip
    verify = user_helm.shell(doc_block("verify"), user_cluster.dir)  # the README's check, as printed
    assert "successfully rolled out" in verify.stdout
    for node in user_cluster.nodes:
        pod = wait_plugin_ready(user_cluster, node)
        lag = node.wait_resource(RESOURCE, "4096")
        print(
            f"{node.name}: helm install returned after {installed['helm_seconds']:.1f}s with plugin pods "
            f"Ready: {installed['ready_when_helm_returned']}; allocatable 4096 {lag:.1f}s after the rollout"
        )
        assert node.resource("capacity", RESOURCE) == "4096"
        assert registered(user_cluster, pod) == 1
        status, body = user_cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:9477/readyz")
        assert status == 200, body
    table = user_helm.shell(doc_block("verify"), user_cluster.dir).stdout.splitlines()
    rows = [["NODE", "KVM"], *([n.name, "4096"] for n in user_cluster.nodes)]
    assert [row.split() for row in table[-len(rows) :]] == rows, table


@every_release
def test_helm_test_runs_a_vm_in_a_pod_and_on_every_node(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """chart/README.md's `helm test` as printed: one pod asking for ate.dev/kvm: 1, non-root
    with no capability, runs `ate-devplugin verify` from the published image; then the
    documented every-node commands: one pod per node offering the resource, each on its
    node, all passing, and the plugin pods untouched by the upgrade that listed the nodes;
    then a device that is no KVM (/dev/null): `helm test` fails, the pod's log saying why."""
    for node in user_cluster.nodes:
        node.wait_resource(RESOURCE, "4096")
    start = time.monotonic()
    out = user_helm.shell(doc_block("helm-test"), user_cluster.dir)
    print(f"helm test returned after {time.monotonic() - start:.1f}s:\n{out.stdout}")
    (pod,) = helm_test_passed(user_cluster, out.stdout)
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] == "1"
    plugins = sorted(p["metadata"]["uid"] for p in plugin_pods(user_cluster))
    start = time.monotonic()
    out = user_helm.shell(doc_block("helm-test-every-node"), user_cluster.dir)
    print(f"every node: upgrade and helm test returned after {time.monotonic() - start:.1f}s:\n{out.stdout}")
    pods = helm_test_passed(user_cluster, out.stdout)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(n.name for n in user_cluster.nodes)
    assert sorted(p["metadata"]["uid"] for p in plugin_pods(user_cluster)) == plugins, "the DaemonSet rolled"
    # A failing verdict fails `helm test`, the reason last in the pod's log: a device that is no KVM.
    user_helm.run("upgrade", RELEASE, *user_helm.chart, "--namespace", NAMESPACE, "--reuse-values",
                  "--set", "test.device=/dev/null", "--set-json", "test.nodes=[]")  # fmt: skip
    failed = user_helm.run("test", RELEASE, "--namespace", NAMESPACE, "--logs", check=False)
    print(f"helm test on /dev/null: exit {failed.returncode}\n{failed.stdout}{failed.stderr}")
    assert failed.returncode != 0
    assert re.search(r"^Phase:\s+Failed$", failed.stdout, flags=re.MULTILINE), failed.stdout
    assert re.search(
        r"^FAIL not-a-kvm-device: /dev/null: character device 1:3 does not answer KVM_GET_API_VERSION",
        failed.stdout, flags=re.MULTILINE,
    ), failed.stdout  # fmt: skip
    user_helm.run("upgrade", RELEASE, *user_helm.chart, "--namespace", NAMESPACE, "--reuse-values",
                  "--set", "test.device=")  # fmt: skip
    # Test pods stay until the next `helm test`, and helm uninstall leaves hooks' objects.
    user_cluster.kubectl("delete", "pods", "-n", NAMESPACE, "-l", TEST_SELECTOR, "--wait=true", timeout=120)


@every_release
def test_the_node_pulled_the_published_image(
    user_cluster: Cluster, installed: dict[str, Any], registry: Registry
) -> None:
    """The chart's default image, pulled by each node's containerd from the registry: every
    plugin pod runs the very manifest the registry serves under the release's tag."""
    digest = registry.manifest_digest(IMAGE_REPOSITORY, VERSION)
    for node in user_cluster.nodes:
        pod = only_plugin_pod(user_cluster, node)
        (status,) = pod["status"]["containerStatuses"]
        assert pod["spec"]["containers"][0]["image"] == PUBLISHED_IMAGE
        assert status["imageID"] == f"ghcr.io/{IMAGE_REPOSITORY}@{digest}", (node.name, status)
        about = f"involvedObject.name={pod['metadata']['name']}"
        events = user_cluster.get_json("events", "-n", NAMESPACE, "--field-selector", about)
        pulled = [e["message"] for e in events["items"] if e["reason"] == "Pulled"]
        assert pulled, (node.name, [e["reason"] for e in events["items"]])
        assert PUBLISHED_IMAGE in pulled[0]
        assert "already present" not in pulled[0], (node.name, pulled)
        assert PUBLISHED_IMAGE in node_images(node)


# --- 7 (started early: it watches the whole path). Prometheus through service discovery --


# The chart's alert rules, AteDevpluginPodMissing's `for` cut short with the chart's own value.
QUICK_POD_MISSING = "prometheusRule.alerts.AteDevpluginPodMissing.for=10s"


@pytest.fixture(scope="module")
def prometheus(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxPrometheus]:
    rules = rendered_rules(str(user_helm.path), tmp_path_factory.mktemp("rules") / "alerts.yaml", QUICK_POD_MISSING)
    with scraping(user_cluster, str(user_helm.path), [rules], with_kube_state_metrics=True) as prom:
        yield prom


@every_release
def test_prometheus_finds_the_plugin_pod_with_the_service_monitor_labels(
    user_cluster: Cluster, prometheus: SandboxPrometheus
) -> None:
    prometheus.wait_for_targets_up(timeout=120)
    samples = prometheus.wait_for(
        'ate_devplugin_registered{resource_name="ate.dev/kvm"} == 1',
        lambda found: len(found) == len(user_cluster.nodes),
        timeout=60,
    )
    by_node = {s.labels["node"]: s.labels for s in samples}
    assert sorted(by_node) == sorted(n.name for n in user_cluster.nodes)
    for node in user_cluster.nodes:
        labels = by_node[node.name]
        assert labels["namespace"] == NAMESPACE
        assert labels["pod"] == only_plugin_pod(user_cluster, node)["metadata"]["name"]
        assert labels["job"] == "ate-devplugin"


def test_a_release_elsewhere_names_its_own_image(
    user_cluster: Cluster, registry: Registry, image: BuiltImage, user_helm: Helm
) -> None:
    """Published under another path (a mirror, a fork), the chart's default image is the
    one pushed with it: the user installs it without setting an image."""
    release(user_cluster, registry, image, "ghcr.io/mirror")
    assert registry.tags("mirror/ate-devplugin") == [VERSION]
    out = user_helm.run("template", RELEASE, "oci://ghcr.io/mirror/charts/ate-devplugin", "--version", VERSION,
                        "--show-only", "templates/daemonset.yaml")  # fmt: skip
    ds = yaml.safe_load(out.stdout)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/mirror/ate-devplugin:{VERSION}"


# --- 1b. with kube-prometheus-stack, as chart/README.md says -------------------------------


@pytest.fixture
def monitoring_crds(user_cluster: Cluster, tmp_path: Path) -> Iterator[None]:
    """prometheus-operator's CRDs, as kube-prometheus-stack installs them; removed after."""
    try:
        crd_dir = prometheus_operator_crds(tmp_path)
    except LookupError as exc:
        pytest.fail(f"{exc} is needed for the kube-prometheus-stack commands")
    kinds = ("servicemonitors", "podmonitors", "prometheusrules")
    files = [str(crd_dir / f"monitoring.coreos.com_{k}.yaml") for k in kinds]
    for path in files:
        user_cluster.kubectl("apply", "--server-side", "-f", path)
    try:
        crds = [f"crd/{k}.monitoring.coreos.com" for k in kinds]
        user_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
        yield
    finally:
        for path in files:
            user_cluster.kubectl("delete", "--ignore-not-found", "-f", path, check=False)


def test_kube_prometheus_stack_commands_keep_the_image_and_the_pod(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, monitoring_crds: None
) -> None:
    """The README's kube-prometheus-stack commands, run as printed: a values file and
    `helm upgrade --install` with it. The monitors get the label the stack's Prometheus
    selects on, the image stays the published one (no value of it was given, none is
    dropped), and the plugin pod is not even restarted: its template did not change."""
    node = user_cluster.node
    before = only_plugin_pod(user_cluster, node)
    try:
        user_helm.shell(doc_block("kube-prometheus-stack"), user_cluster.dir)
        for kind in ("servicemonitor", "prometheusrule"):
            (obj,) = user_cluster.get_json(kind, "-n", NAMESPACE)["items"]
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["metadata"]
        rule = user_cluster.get_json("prometheusrule", "-n", NAMESPACE)["items"][0]
        exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        assert 'up{job="ate-devplugin"} == 0' in exprs
        ds = user_cluster.get_json("daemonset", "-n", NAMESPACE, RELEASE)
        assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == PUBLISHED_IMAGE
        pod = wait_plugin_ready(user_cluster, node)
        assert pod["metadata"]["uid"] == before["metadata"]["uid"]
    finally:
        user_helm.upgrade()  # back to the defaults, before the CRDs go
    assert not user_cluster.get_json("servicemonitor", "-n", NAMESPACE)["items"]


# --- 1c. DRA against this API server: the egress it needs, and its admission policy --------


def test_dra_egress_and_policy_come_from_the_cluster(user_cluster: Cluster, user_helm: Helm) -> None:
    """What the chart renders for dra.mode=dra with egress restricted, looked up from this
    API server (helm's server-side dry run): egress to the `kubernetes` Service and to the
    API server behind it, and the admission policy, since this API server serves it."""
    # --dry-run=server: lookups reach the API server; --validate: its APIs are the Capabilities.
    out = user_helm.run("template", "dra-check", *user_helm.chart, "-n", NAMESPACE, "--dry-run=server", "--validate",
                        "--set", "dra.mode=dra", "--set", "networkPolicy.restrictEgress=true")  # fmt: skip
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d}
    egress = docs["NetworkPolicy"]["spec"]["egress"]
    service = {"to": [{"ipBlock": {"cidr": f"{API_SERVICE_IP}/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]}
    assert service in egress, egress
    api = {"to": [{"ipBlock": {"cidr": f"{GATEWAY}/32"}}], "ports": [{"port": API_PORT, "protocol": "TCP"}]}
    assert api in egress, egress
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= set(docs)


def slice_manifest(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": "ate.dev", "nodeName": node, "devices": [],
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


def test_slice_policy_keeps_a_token_to_its_own_node(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """The chart's DRA RBAC and admission policy on this API server, exercised with a token
    bound to the running plugin pod (as the kubelet gives the driver its token): the slices
    of its node may be written, another node's may not."""
    cluster = user_cluster
    node = cluster.node.name
    pod = only_plugin_pod(cluster, cluster.node)
    account = pod["spec"]["serviceAccountName"]
    # Another release name (the install's own is taken), for the running pod's ServiceAccount.
    out = user_helm.run("template", "dra-check", *user_helm.chart, "-n", NAMESPACE, "--dry-run=server", "--validate",
                        "--set", "dra.mode=dra", "--set", "serviceAccount.create=false",
                        "--set", f"serviceAccount.name={account}",
                        "--show-only", "templates/dra-rbac.yaml",
                        "--show-only", "templates/dra-admission-policy.yaml")  # fmt: skip
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in objects} >= {"ClusterRole", "ValidatingAdmissionPolicy"}
    token = cluster.kubectl("create", "token", account, "-n", NAMESPACE,
                            "--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                            "--bound-object-uid", pod["metadata"]["uid"], "--duration", "10m")  # fmt: skip
    driver = cluster.dir / "driver.kubeconfig"  # the token only: no client certificate to fall back on
    driver.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": API, "certificate-authority": str(cluster.pki / "ca.crt")}}],
        "users": [{"name": "driver", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "driver"}}],
    }))  # fmt: skip

    def as_driver(*args: str, stdin: str | None = None) -> tuple[int, str]:
        result = cluster.sandbox.run([str(cluster.kubectl_path), "--kubeconfig", str(driver), *args],
                                     stdin=stdin, check=False)  # fmt: skip
        return result.returncode, result.stdout + result.stderr

    for obj in objects:
        cluster.apply(obj)
    try:
        # The policy takes effect once the API server has loaded it: until the write is refused.
        other = json.dumps(slice_manifest("policy-check-other", "other-node"))

        def refused() -> str | None:
            code, text = as_driver("create", "-f", "-", stdin=other)
            if code == 0:
                # As the admin: the policy may load between this create and the delete, and
                # then refuse the driver's delete, leaving the slice to make later creates fail.
                cluster.kubectl("delete", "resourceslice", "policy-check-other", "--ignore-not-found")
                return None
            return text

        message = wait_until("the policy to refuse another node's slice", refused, 60, interval=1)
        assert "may write only that node's ResourceSlices, not those of node other-node" in message, message
        assert f"the DRA driver on node {node}" in message
        code, text = as_driver("create", "-f", "-", stdin=json.dumps(slice_manifest("policy-check-own", node)))
        assert code == 0, text
        code, text = as_driver("delete", "resourceslice", "policy-check-own")
        assert code == 0, text
        # Without the policy, RBAC alone lets the same token write another node's slice.
        for obj in objects:
            if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"])
        last: list[str] = []

        def allowed() -> bool:
            code, text = as_driver("create", "-f", "-", stdin=other)
            last[:] = [text]
            return code == 0

        try:
            wait_until("RBAC alone to allow it", allowed, 60, interval=1)
        except ClusterError as exc:
            raise AssertionError(f"{exc}: {last}") from exc
    finally:
        cluster.kubectl("delete", "resourceslice", "policy-check-own", "policy-check-other", "--ignore-not-found",
                        check=False)  # fmt: skip
        for obj in objects:
            cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)


# --- 2. consumer pods: the device-only example, then QEMU ----------------------------------


@every_release
def test_example_pod_checks_kvm_without_privilege(user_cluster: Cluster, installed: dict[str, Any]) -> None:
    """The device-only example as shipped (its own check): uid 10001, no capability, no
    privilege escalation, admitted under the restricted Pod Security Standard; the node's
    /dev/kvm is 0600 root:root and containerd sets device_ownership_from_security_context.
    On every node."""
    for node in user_cluster.nodes:
        run = run_pod(user_cluster, example_pod("kvm-consumer", node=node))
        print(f"{node.name}: {run.logs.strip()}")
        assert (run.phase, run.exit_code) == ("Succeeded", 0), run
        assert re.fullmatch(r"kvm ok - crw------- 1 10001 10001 10, 232 .+ /dev/kvm", run.logs.strip()), run.logs


def sockets(node: Node) -> list[str]:
    out = node.run(["ls", "/var/lib/kubelet/device-plugins"]).stdout
    return sorted(name for name in out.split() if name.startswith("ate-"))


def with_worker_preset(cluster: Cluster, helm: Helm) -> None:
    """docs/examples/microvm-worker-values.yaml installed (the same values again change
    nothing); a changed config reaches the plugins live (restartOnChange false)."""
    helm.upgrade("-f", str(WORKER_VALUES))
    for node in cluster.nodes:
        node.wait_resource(TUN, str(TUN_UNITS), timeout=180)
        node.wait_resource(RESOURCE, "4096")


@every_release
def test_the_microvm_preset_advertises_what_each_node_has(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """The micro-VM worker preset: /dev/kvm and /dev/net/tun exist on these nodes, the
    vhost modules are not loaded, so /dev/vhost-net and /dev/vhost-vsock do not: those two
    resources are simply not advertised (no socket, nothing in the node's status), and the
    plugin serves the others and is ready."""
    with_worker_preset(user_cluster, user_helm)
    for node in user_cluster.nodes:
        absent = [p for p in ABSENT_DEVICES if node.run(["test", "-e", p], check=False).returncode != 0]
        assert absent == list(ABSENT_DEVICES), f"{node.name} has {set(ABSENT_DEVICES) - set(absent)}"
        pod = wait_plugin_ready(user_cluster, node)
        status = node.get()["status"]
        ours = {k: v for k, v in status["capacity"].items() if k.startswith("ate.dev/")}
        values = metrics(user_cluster, pod)
        registered_ = {r: sample(values, "ate_devplugin_registered", resource_name=r) for r in PRESET_RESOURCES}
        print(f"{node.name}: capacity {ours}; sockets {sockets(node)}; registered {registered_}")
        # Beside them, the KVM prober's own resource (the prober is on by default).
        assert ours == {RESOURCE: "4096", TUN: str(TUN_UNITS), PROBER: "4"}, ours
        assert status["allocatable"][TUN] == str(TUN_UNITS)
        # One socket per advertised resource (from 1.37 each named with the plugin pod's UID).
        found = sockets(node)
        bases = sorted(re.sub(r"(-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12})?\.sock$", "", n) for n in found)
        assert bases == ["ate-ate-dev-kvm", "ate-ate-dev-kvm-prober", "ate-ate-dev-tun"], found
        assert registered_ == {RESOURCE: 1, TUN: 1, "ate.dev/vhost-net": 0, "ate.dev/vhost-vsock": 0}, registered_
        assert registered(user_cluster, pod, PROBER) == 1
        code, body = user_cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:9477/readyz")
        assert code == 200, body


@every_release
def test_qemu_boots_its_guest_unprivileged_on_every_node(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """docs/examples/microvm-worker-pod.yaml as shipped (image swapped): the root init
    container with NET_ADMIN alone makes the tap through the /dev/net/tun it got from
    ate.dev/tun; QEMU as uid 10001 with no capability gets /dev/kvm from ate.dev/kvm, boots
    the guest, which prints its marker and finds its virtio-net NIC, and exits 67."""
    with_worker_preset(user_cluster, user_helm)
    for node in user_cluster.nodes:
        run = run_pod(user_cluster, worker("qemu", node=node))
        booted_as_shipped(run, user_cluster.cgroup)
        assert run.nodes()["/dev/kvm"].startswith("crw------- 10001 10001 a:e8"), run.nodes()
        assert run.nodes()["/dev/net/tun"].startswith("crw------- 10001 10001 a:c8"), run.nodes()
        if user_cluster.cgroup == 1:
            assert "c 10:232 rw" in run.devices_list(), run.devices_list()
        else:
            assert run.devices_list() == []  # v2: no such file, the runtime's eBPF filter holds the rules


@every_release
def test_qemu_without_the_request_says_why(user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm) -> None:
    """The worker without ``ate.dev/kvm``: no /dev/kvm, and QEMU says so before any guest runs."""
    with_worker_preset(user_cluster, user_helm)
    run = run_pod(user_cluster, worker("qemu-no-kvm", kvm=False, node=last(user_cluster)))
    print(f"without ate.dev/kvm: exit {run.exit_code}; {run.logs.strip()}")
    assert run.exit_code == run.qemu_exit == 1, run.logs
    assert NO_KVM in run.logs
    assert "No such file or directory" in run.nodes()["/dev/kvm"]
    assert not run.marker


def init_failure(cluster: Cluster, pod: dict[str, Any]) -> tuple[int | None, str]:
    """Run ``pod``, whose init container is to fail: its exit code and output."""
    pod["metadata"]["name"] += "-" + uuid.uuid4().hex[:6]
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    ensure_workload_namespace(cluster)
    cluster.apply(pod)
    try:
        got = wait_until(
            f"pod {name} to fail",
            lambda: (p := cluster.get_json("pod", "-n", namespace, name))["status"].get("phase") == "Failed" and p,
            180,
        )
        (status,) = got["status"]["initContainerStatuses"]
        logs = cluster.kubectl("logs", "-n", namespace, name, "-c", status["name"], check=False)
        return status["state"]["terminated"]["exitCode"], logs
    finally:
        cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)


def test_the_tap_needs_net_admin_and_a_tun_node_and_nothing_more(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """What the worker's init container needs, taken away one at a time: without NET_ADMIN
    the kernel refuses the tap; without ate.dev/tun there is no /dev/net/tun to ask it
    through (the runtime allows 10:200 in every container but makes no node), so the
    alternative is MKNOD and a node of its own, shared with QEMU through an emptyDir."""
    with_worker_preset(user_cluster, user_helm)
    node = user_cluster.node
    pod = worker("tap-no-net-admin", node=node)
    pod["spec"]["initContainers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"]}
    code, logs = init_failure(user_cluster, pod)
    print(f"init container without NET_ADMIN: exit {code}: {logs.strip()}")
    assert code == 1
    assert "CapEff=0000000000000000" in logs
    assert "ioctl(TUNSETIFF): Operation not permitted" in logs

    pod = worker("tap-no-tun", node=node)
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        del container["resources"]["limits"][TUN]
    code, logs = init_failure(user_cluster, pod)
    print(f"init container without ate.dev/tun: exit {code}: {logs.strip()}")
    assert code == 1
    assert "CapEff=0000000000001000" in logs  # NET_ADMIN (12) only
    assert "open: No such file or directory" in logs

    pod = worker("tap-mknod", node=node)
    (init,) = pod["spec"]["initContainers"]
    (vmm,) = pod["spec"]["containers"]
    for container in (init, vmm):
        del container["resources"]["limits"][TUN]
        container["volumeMounts"] = [{"name": "dev-net", "mountPath": "/dev/net"}]
    pod["spec"]["volumes"] = [{"name": "dev-net", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    init["securityContext"]["capabilities"]["add"] = ["NET_ADMIN", "MKNOD"]
    init["command"] = [*init["command"][:4], "sh", "-ec",
                       'mknod -m 0666 /dev/net/tun c 10 200; exec "$@"', "mknod", *init["command"][4:]]  # fmt: skip
    run = run_pod(user_cluster, pod)
    print(f"MKNOD and a node of its own instead of ate.dev/tun: {run.summary()}")
    assert run.booted(), run.logs
    assert run.nodes()["/dev/net/tun"].startswith("crw-rw-rw- 0 0 a:c8"), run.nodes()


# --- 3. non-root consumers on a node where /dev/kvm is 0600 root:root -------------------


@contextlib.contextmanager
def containerd_device_ownership(node: Node, enabled: bool) -> Iterator[None]:
    node.restart_containerd(device_ownership=enabled)
    try:
        yield
    finally:
        node.restart_containerd(device_ownership=True)


@contextlib.contextmanager
def kvm_node_with_group(node: Node, gid: int, mode: int = 0o660) -> Iterator[None]:
    """/dev/kvm as distributions with a kvm group make it (0660 root:kvm), or of another
    ``mode``, in the node's mount namespace only: a node of the same major:minor bind-mounted
    over it."""
    path = "/run/ate-e2e-kvm"
    node.run(["sh", "-ec", f"mknod -m {mode:04o} {path} c 10 232; chown 0:{gid} {path}; "
                           f"mount --bind {path} /dev/kvm; stat -c '%a %u:%g %t:%T' /dev/kvm"])  # fmt: skip
    try:
        yield
    finally:
        node.run(["sh", "-ec", f"umount /dev/kvm; rm -f {path}"])


def test_non_root_pod_without_device_ownership_is_refused(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """The device node keeps the host's 0600 root:root: the example's check exits 1, and
    QEMU says it cannot open /dev/kvm."""
    with_worker_preset(user_cluster, user_helm)
    node = user_cluster.node
    with containerd_device_ownership(node, enabled=False):
        example = run_pod(user_cluster, example_pod("kvm-no-ownership", node=node))
        qemu = run_pod(user_cluster, worker("qemu-no-ownership", node=node))
    print(f"without device ownership: the example exits {example.exit_code}; QEMU: {qemu.logs.strip()}")
    assert (example.phase, example.exit_code, example.logs) == ("Failed", 1, "")
    assert qemu.nodes()["/dev/kvm"].startswith("crw------- 0 0 a:e8"), qemu.nodes()
    assert QEMU_EACCES in qemu.logs
    assert qemu.exit_code == 1
    assert not qemu.marker


def test_non_root_pod_with_the_device_group_as_supplemental_group(
    user_cluster: Cluster, installed: dict[str, Any]
) -> None:
    node = user_cluster.node
    with containerd_device_ownership(node, enabled=False), kvm_node_with_group(node, KVM_GID):
        with_group = run_pod(user_cluster, example_pod("kvm-group", supplemental_groups=(KVM_GID,), node=node))
        without = run_pod(user_cluster, example_pod("kvm-no-group", node=node))
    print(f"with the group: {with_group.logs.strip()}; without: exit {without.exit_code}")
    assert re.fullmatch(r"kvm ok - crw-rw---- 1 root 36 10, 232 .+ /dev/kvm", with_group.logs.strip()), with_group
    assert (without.phase, without.exit_code) == ("Failed", 1)


#: The /dev/kvm modes distributions make, with the group of each: 0666 (systemd's udev rule),
#: 0660 root:kvm (Debian, Ubuntu; Fedora's kvm GID here), 0600 root:root (no rule; these machines).
NODE_MODES = ((0o666, 0), (0o660, KVM_GID), (0o600, 0))


def test_helm_test_passes_on_every_common_node_mode_with_the_runtimes_default_ownership(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """`helm test` as the README prints it, containerd's device_ownership_from_security_context
    off (its default: the container's node is the host node's owner and mode), on /dev/kvm of
    each common mode: the test pod, UID 0 with no capability, opens all three. Then the pod as
    UID 10001 on the 0660 node: FAIL, its log naming the node's mode and owner and what to
    change, and back."""
    node = user_cluster.node
    script = doc_block("helm-test")
    with contextlib.ExitStack() as cleanup:
        # Test pods stay until the next `helm test`, and helm uninstall leaves hooks' objects.
        cleanup.callback(user_cluster.kubectl, "delete", "pods", "-n", NAMESPACE, "-l", TEST_SELECTOR, "--wait=true",
                         timeout=120)  # fmt: skip
        cleanup.enter_context(containerd_device_ownership(node, enabled=False))
        for mode, gid in NODE_MODES:
            with kvm_node_with_group(node, gid, mode):
                start = time.monotonic()
                out = user_helm.shell(script, user_cluster.dir)
                took = time.monotonic() - start
                (pod,) = helm_test_passed(user_cluster, out.stdout)
                shown = f"{stat.filemode(0o20000 | mode)} ({mode:04o}) owner 0:{gid} here"
                print(f"/dev/kvm {mode:04o} 0:{gid}, device ownership off: helm test passed in {took:.1f}s")
                assert f"  device:          character device 10:232, {shown}\n" in out.stdout, out.stdout
                assert pod["spec"]["securityContext"]["runAsUser"] == 0
                if mode != 0o660:
                    continue
                user_helm.run("upgrade", RELEASE, *user_helm.chart, "--namespace", NAMESPACE, "--reuse-values",
                              "--set", "test.podSecurityContext.runAsUser=10001",
                              "--set", "test.podSecurityContext.runAsGroup=10001",
                              "--set", "test.podSecurityContext.runAsNonRoot=true")  # fmt: skip
                try:
                    failed = user_helm.run("test", RELEASE, "--namespace", NAMESPACE, "--logs", check=False)
                finally:
                    user_helm.run("upgrade", RELEASE, *user_helm.chart, "--namespace", NAMESPACE, "--reuse-values",
                                  "--set", "test.podSecurityContext.runAsUser=0",
                                  "--set", "test.podSecurityContext.runAsGroup=0",
                                  "--set", "test.podSecurityContext.runAsNonRoot=false")  # fmt: skip
                report = failed.stdout
                print(f"as uid 10001 on {mode:04o} 0:{gid}: exit {failed.returncode}{report.split('POD LOGS:')[-1]}")
                assert failed.returncode != 0
                assert f"  device:          character device 10:232, {shown}\n" in report, report
                assert "  process:         uid 10001, gid 10001, groups 10001; no capabilities\n" in report
                assert "  refused:         its mode gives uid 10001 (groups 10001) no read-write access (" in report
                assert f"or add gid {KVM_GID}, the node's group, to the pod's supplementalGroups" in report
                assert re.search(r"^FAIL no-permission: /dev/kvm: opening character device 10:232: EACCES",
                                 report, flags=re.MULTILINE), report  # fmt: skip


# --- 4. kubelet restart, plugin pod replaced ---------------------------------------------


def heartbeat(node: Node, status: dict[str, Any] | None = None) -> str:
    """When the kubelet last posted the node's status (its Ready condition's heartbeat)."""
    status = status or node.get()
    beat: str = next(c["lastHeartbeatTime"] for c in status["status"]["conditions"] if c["type"] == "Ready")
    return beat


@every_release
def test_kubelet_restart_needs_no_plugin_restart(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    with_worker_preset(user_cluster, user_helm)
    node = last(user_cluster)
    others = {n.name: only_plugin_pod(user_cluster, n) for n in user_cluster.nodes if n is not node}
    pod = only_plugin_pod(user_cluster, node)
    restarts_before = pod["status"]["containerStatuses"][0]["restartCount"]
    assert sample(metrics(user_cluster, pod), "ate_devplugin_kubelet_restarts_total") == 0
    beat_before = heartbeat(node)
    node.stop_kubelet(signal.SIGKILL)
    node.start_kubelet()
    node.wait_ready()
    wait_until("the plugin to see the restart",
               lambda: sample(metrics(user_cluster, pod), "ate_devplugin_kubelet_restarts_total") == 1,
               120)  # fmt: skip
    wait_until("registered again", lambda: registered(user_cluster, pod) == 1, 120)

    def fresh_allocatable() -> bool:
        # A node status the restarted kubelet posted (it posts one when it starts, and
        # again when allocatable changes), with the plugin registered.
        status = node.get()
        return heartbeat(node, status) != beat_before and status["status"]["allocatable"].get(RESOURCE) == "4096"

    wait_until("allocatable 4096 from the restarted kubelet", fresh_allocatable, 120)
    same = only_plugin_pod(user_cluster, node)
    assert same["metadata"]["uid"] == pod["metadata"]["uid"]
    assert same["status"]["containerStatuses"][0]["restartCount"] == restarts_before
    run = run_pod(user_cluster, worker("qemu-after-kubelet-restart", node=node))
    booted_as_shipped(run, user_cluster.cgroup)
    # Another node's kubelet, and so its plugin, saw nothing of it (its own kubelet.sock).
    for other in others.values():
        assert sample(metrics(user_cluster, other), "ate_devplugin_kubelet_restarts_total") == 0
        assert registered(user_cluster, other) == 1


# --- a device that goes away and comes back ------------------------------------------------

PRIVATE_DEV = "/run/ate-e2e-dev"  # in each node's tmpfs: the host's /dev is never touched


@every_release
def test_device_gone_and_back_is_seen_by_the_node(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, prometheus: SandboxPrometheus
) -> None:
    """A device node that disappears (a module unloaded) and comes back. The host's /dev
    must stay as it is, so the plugins watch a device directory of each node's own
    (hostPaths.dev) holding a node of /dev/kvm's major:minor; pods still get /dev/kvm.
    It goes on the last node only: the others keep offering it."""
    kvm = f"{PRIVATE_DEV}/kvm"
    node = last(user_cluster)
    for n in user_cluster.nodes:
        n.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {kvm} c 10 232"])
    user_helm.upgrade("--set", f"hostPaths.dev={PRIVATE_DEV}")
    try:
        pod = wait_plugin_ready(user_cluster, node)
        wait_until("registered", lambda: registered(user_cluster, pod) == 1, 120)
        for n in user_cluster.nodes:
            n.wait_resource(RESOURCE, "4096")
        # Prometheus must see the counters before and after, or increase() has nothing to show.
        changes = f'ate_devplugin_device_health_changes_total{{pod="{pod["metadata"]["name"]}", health="%s"}}'
        prometheus.wait_for(changes % "unhealthy" + " == 0", timeout=120)
        node.run(["rm", kvm])
        node.wait_resource(RESOURCE, "0")
        assert node.resource("capacity", RESOURCE) == "4096"
        values = metrics(user_cluster, pod)
        assert sample(values, "ate_devplugin_devices", resource_name=RESOURCE, health="unhealthy") == 4096
        for other in user_cluster.nodes:
            if other is not node:
                assert other.resource("allocatable", RESOURCE) == "4096", other.name
        node.run(["mknod", "-m", "0600", kvm, "c", "10", "232"])
        node.wait_resource(RESOURCE, "4096")
        values = metrics(user_cluster, pod)
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="unhealthy")
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="healthy")
        prometheus.wait_for(changes % "healthy" + " >= 1", timeout=120)
    finally:
        user_helm.upgrade()
    for n in user_cluster.nodes:
        wait_plugin_ready(user_cluster, n)
        n.wait_resource(RESOURCE, "4096")


# --- 7. every dashboard query has data -----------------------------------------------------


def test_every_dashboard_query_returns_data_from_the_cluster(
    user_cluster: Cluster, prometheus: SandboxPrometheus
) -> None:
    values = dashboard_values(user_cluster.node)
    # The plugin pod was just replaced (previous test): wait until its own series are in.
    pod = only_plugin_pod(user_cluster, user_cluster.node)
    prometheus.wait_for(f'ate_devplugin_registered{{pod="{pod["metadata"]["name"]}"}} == 1', timeout=120)
    end = time.time()
    empty, checked = [], 0
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for where, expr, instant in dashboard_queries(json.loads(path.read_text())):
            if reads_pod_resources(expr) or reads_dra(expr):
                continue  # what pods hold and DRA: test_pods_holding_units.py and test_dra.py run these
            query = fill(expr, values)
            checked += 1
            if instant:
                found = prometheus.query(query, at=end)
                ok = bool(found)
            else:
                series = prometheus.query_range(query, prometheus.started_at, end, step=2)
                ok = any(v == v for s in series for _, v in s.values)  # v == v: not NaN
            if not ok:
                empty.append(f"{path.name} {where}: {query}")
    assert checked >= 20
    assert not empty, f"{len(empty)} of {checked} queries gave no data:\n" + "\n".join(empty)


@every_release
def test_deleted_plugin_pod_exits_0_and_is_replaced(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    with_worker_preset(user_cluster, user_helm)
    node = last(user_cluster)
    old = only_plugin_pod(user_cluster, node)
    code, took = watch_exit_code(user_cluster, old["metadata"]["name"])
    assert code == 0, f"the deleted plugin pod's container exited {code}"
    new = wait_plugin_ready(user_cluster, node)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    wait_until("the new pod registered", lambda: registered(user_cluster, new) == 1, 120)
    node.wait_resource(RESOURCE, "4096")
    run = run_pod(user_cluster, worker("qemu-after-new-plugin-pod", node=node))
    booted_as_shipped(run, user_cluster.cgroup)
    print(f"plugin pod deleted in {took:.1f}s")


def test_a_plugin_pod_that_cannot_start_shows_on_the_fleet_dashboard_and_fires_its_alert(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, prometheus: SandboxPrometheus
) -> None:
    """An upgrade to a device-plugin directory the node does not have (another distribution's
    path): the DaemonSet replaces the plugin pod with one that stays Pending, its host path not
    mounted, so without an IP and without a scrape target. kube-state-metrics reports it from
    the cluster's own controllers and kubelet; the Fleet dashboard's queries count the node
    down and list the pod, and AteDevpluginPodMissing (its `for` cut to 10 s by the chart's
    value) fires with the pod and the node. Then helm puts the release back."""
    node = user_cluster.node
    values = dashboard_values(node)
    fleet = {p["title"]: p for p in fleet_panels()}
    old = only_plugin_pod(user_cluster, node)
    wrong = "hostPaths.devicePlugins=/var/lib/k0s/kubelet/device-plugins"  # not on this node
    began = time.monotonic()
    user_helm.run("upgrade", RELEASE, *user_helm.chart, "--namespace", NAMESPACE, "--reset-values",
                  *user_helm.image_values, "--set", wrong)  # fmt: skip

    def not_mounted() -> dict[str, Any] | None:
        about = "involvedObject.kind=Pod,reason=FailedMount"
        events = user_cluster.get_json("events", "-n", NAMESPACE, "--field-selector", about)["items"]
        failed = {e["involvedObject"]["name"] for e in events}
        return next(
            (p for p in plugin_pods(user_cluster, node)
             if p["metadata"]["uid"] != old["metadata"]["uid"] and p["status"].get("phase") == "Pending"
             and not p["status"].get("podIP") and p["metadata"]["name"] in failed),
            None,
        )  # fmt: skip

    try:
        pending = wait_until("the new plugin pod Pending, its host path not mounted", not_mounted, 180)
        name = pending["metadata"]["name"]
        prometheus.wait_for(f'kube_pod_status_phase{{pod="{name}", phase="Pending"}} == 1', timeout=60)
        alert = f'ALERTS{{alertname="AteDevpluginPodMissing", alertstate="firing", pod="{name}", node="{node.name}"}}'
        try:
            prometheus.wait_for(alert, timeout=120)
            fired = time.monotonic() - began
        except TimeoutError:
            (rule,) = [r for r in prometheus.rules() if r["name"] == "AteDevpluginPodMissing"]
            print(f"rule: {json.dumps(rule, indent=1)}\nits expression now: {prometheus.query(rule['query'])}")
            raise

        def instant(title: str, ref: int = 0) -> list[Any]:
            return prometheus.query(fill(fleet[title]["targets"][ref]["expr"], values))

        assert [s.value for s in instant("Daemons down")] == [1]
        assert [s.value for s in instant("Daemons up")] == [0]
        assert [s.value for s in instant("Daemons up", 1)] == [1], "one node expected"
        rows = {(s.labels["node"], s.labels["pod"], s.labels["phase"]) for s in instant("Plugin pods, by node")}
        assert rows == {(node.name, name, "Pending")}
        assert [s.value for s in instant("Plugin pods, by node")] == [1], "not reporting: yes"
        assert [(s.labels["node"], s.value) for s in instant("Daemon up, by node")] == [(node.name, 0)]
        print(f"{name} Pending without an IP; AteDevpluginPodMissing firing {fired:.0f}s after the upgrade; Fleet: "
              f"Daemons up 0 of 1 expected, Daemons down 1, Plugin pods {sorted(rows)} not reporting")  # fmt: skip
    finally:
        user_helm.upgrade()
    wait_plugin_ready(user_cluster, node)
    node.wait_resource(RESOURCE, "4096")
    prometheus.wait_for('absent(ALERTS{alertname="AteDevpluginPodMissing"})', timeout=120)


def fleet_panels() -> list[dict[str, Any]]:
    dashboard = json.loads((REPO / "dashboards" / "ate-devplugin-fleet.json").read_text())
    return [p for top in dashboard["panels"] for p in (top.get("panels", []) if top["type"] == "row" else [top])]


# --- 5. helm upgrade ------------------------------------------------------------------------


def when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def deleted(events: list[dict[str, Any]]) -> set[str]:
    return {e["object"]["metadata"]["uid"] for e in events if e["type"] == "DELETED"}


def ready_since(pod: dict[str, Any]) -> datetime.datetime | None:
    cond = next((c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"), None)
    return when(cond["lastTransitionTime"]) if cond and cond["status"] == "True" else None


@every_release
def test_helm_upgrade_rolls_without_a_gap_where_the_kubelet_allows_it(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    """A rollout of every plugin pod (a new pod annotation), with every plugin pod and Node
    object the API server held meanwhile watched. From 1.37 (one endpoint per socket path)
    the chart rolls with maxSurge 1, each pod's sockets named with its UID: on each node the
    new pod is Ready, that is registered, before the old one is deleted, and every node
    status the kubelet posts reads allocatable 4096. Before 1.37 (one endpoint per resource)
    it rolls with maxUnavailable 1: the old pod goes first, and the gap until the new pod is
    registered is measured."""
    overlap = tuple(map(int, user_cluster.release.split("."))) >= (1, 37)
    old = {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in plugin_pods(user_cluster)}
    with (
        watching(user_cluster, "nodes") as node_events,
        watching(user_cluster, "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR) as pod_events,
    ):
        user_helm.upgrade("--set-string", f"podAnnotations.e2e-rollout={uuid.uuid4().hex[:8]}")
        wait_plugin_ready(user_cluster)
        wait_until("the old plugin pods gone", lambda: set(old.values()) <= deleted(pod_events()), 120)
        time.sleep(25)  # two of the kubelets' 10 s status updates after the old endpoints stopped
        nodes, pods = node_events(), pod_events()
    allocatable = {n: [e["object"]["status"].get("allocatable", {}).get(RESOURCE) for e in nodes
                       if e["object"]["metadata"]["name"] == n] for n in old}  # fmt: skip
    gaps = {}
    for node in old:
        seen = [e["object"] for e in pods if e["object"]["spec"].get("nodeName") == node]
        stopped = min(when(p["metadata"]["deletionTimestamp"]) for p in seen
                      if p["metadata"]["uid"] == old[node] and p["metadata"].get("deletionTimestamp"))  # fmt: skip
        registered_at = min(filter(None, (ready_since(p) for p in seen if p["metadata"]["uid"] != old[node])))
        gaps[node] = (registered_at - stopped).total_seconds()
    changes = {n: [k for k, _ in itertools.groupby(v)] for n, v in allocatable.items()}
    print(f"rollout on {user_cluster.release}: allocatable in the statuses posted (changes only): {changes}; "
          f"new pod registered minus old pod deleted, s: {gaps}")  # fmt: skip
    if overlap:
        assert all(gap <= 0 for gap in gaps.values()), gaps
        assert all(values and set(values) == {"4096"} for values in allocatable.values()), allocatable
    else:
        assert all(gap >= 0 for gap in gaps.values()), gaps
    for node in user_cluster.nodes:
        node.wait_resource(RESOURCE, "4096")
        assert registered(user_cluster, only_plugin_pod(user_cluster, node)) == 1


TWO_RESOURCES = """
deviceConfig:
  resources:
    - name: ate.dev/kvm
      devices: [/dev/kvm]
      units: 4096
    - name: ate.dev/tun
      devices: [/dev/net/tun]
      units: 16
"""


@pytest.fixture(scope="module")
def two_resources(user_cluster: Cluster) -> str:
    """A values file adding /dev/net/tun as ate.dev/tun next to /dev/kvm."""
    path = user_cluster.dir / "two-resources.yaml"
    path.write_text(TWO_RESOURCES)
    return str(path)


def test_helm_upgrade_adding_a_resource_rolls_out(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=true: the config checksum changed, so the pod is replaced."""
    node = user_cluster.node
    old = only_plugin_pod(user_cluster, node)
    user_helm.upgrade("-f", two_resources, "--set", "deviceConfig.restartOnChange=true")
    wait_until(
        "the rolled-out plugin pod",
        lambda: next(
            (p for p in plugin_pods(user_cluster, node) if p["metadata"]["uid"] != old["metadata"]["uid"]), None
        ),
        240,
    )
    pod = wait_plugin_ready(user_cluster, node)
    wait_until("both resources registered", lambda: registered(user_cluster, pod, TUN) == 1, 120)
    assert registered(user_cluster, pod) == 1
    node.wait_resource(TUN, "16")
    # The old pod's endpoints going away can zero it in a node status just before the
    # new pod's: wait on allocatable itself, as everywhere.
    node.wait_resource(RESOURCE, "4096")


def test_helm_upgrade_changing_a_resource_is_picked_up_live(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=false: the same pod reads the updated ConfigMap. The
    kubelet refreshes ConfigMap volumes on its pod sync (every minute by default; these
    clusters' kubelets sync every 10 s)."""
    node = user_cluster.node
    live = ("-f", two_resources, "--set", "deviceConfig.restartOnChange=false")
    user_helm.upgrade(*live)  # without the checksum annotation: the pod template changes once
    wait_plugin_ready(user_cluster, node)
    node.wait_resource(TUN, "16")
    before = only_plugin_pod(user_cluster, node)
    start = time.monotonic()
    user_helm.upgrade(*live, "--set", "deviceConfig.resources[1].units=32")
    waited = node.wait_resource(TUN, "32", timeout=300)
    after = only_plugin_pod(user_cluster, node)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert (
        after["status"]["containerStatuses"][0]["restartCount"]
        == before["status"]["containerStatuses"][0]["restartCount"]
    )
    assert node.resource("allocatable", RESOURCE) == "4096"
    print(f"units 16 -> 32 live: allocatable 32 after {time.monotonic() - start:.0f}s ({waited:.0f}s after helm)")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("deviceConfig.resources[1].units=0", "units"),
        ("deviceConfig.resources[1].devices[0]=/etc/shadow", "devices"),
        ("securityContext.privileged=true", "privileged"),
    ],
)
def test_helm_upgrade_with_a_bad_value_is_refused(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm, two_resources: str, value: str, field: str
) -> None:
    node = user_cluster.node
    before = only_plugin_pod(user_cluster, node)
    tun = node.resource("allocatable", TUN)
    out = user_helm.upgrade("-f", two_resources, "--set", value, check=False)
    assert out.returncode != 0
    assert field in out.stderr, out.stderr
    after = only_plugin_pod(user_cluster, node)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert node.resource("allocatable", RESOURCE) == "4096"
    assert node.resource("allocatable", TUN) == tun


# --- 6. helm uninstall ----------------------------------------------------------------------


@every_release
def test_helm_uninstall_removes_the_socket_and_the_resource(
    user_cluster: Cluster, installed: dict[str, Any], user_helm: Helm
) -> None:
    assert len(plugin_pods(user_cluster)) == len(user_cluster.nodes)
    had_tun = {}
    for node in user_cluster.nodes:
        assert sockets(node), f"the plugin's sockets on {node.name} before uninstall"
        had_tun[node.name] = node.resource("capacity", TUN) is not None
    user_helm.uninstall()
    wait_until("the plugin pods gone", lambda: not user_cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    for node in user_cluster.nodes:
        assert sockets(node) == []
        node.wait_resource(RESOURCE, "0")
        if had_tun[node.name]:
            node.wait_resource(TUN, "0")


# --- 6b. a namespace that enforces baseline ----------------------------------------------------


def test_without_the_label_no_plugin_pod_is_made_and_the_label_admits_them(
    user_cluster: Cluster, user_helm: Helm
) -> None:
    """The install without the namespace's label, where it enforces Pod Security `baseline` (a
    cluster's default): helm succeeds, the DaemonSet makes no pod, and describing it shows the
    refusal docs/runbook.md quotes. The label NOTES print then admits the pods without a
    reinstall. Runs after the uninstall (no release), on 1.35."""

    def refused(daemonset: str) -> str | None:
        about = f"involvedObject.kind=DaemonSet,involvedObject.name={daemonset},reason=FailedCreate"
        events = user_cluster.get_json("events", "-n", NAMESPACE, "--field-selector", about)["items"]
        return next((e["message"] for e in events), None)

    ensure_namespace(user_cluster, NAMESPACE, "baseline")
    start = time.monotonic()
    user_helm.run("install", RELEASE, *user_helm.chart, "--namespace", NAMESPACE)
    try:
        message = wait_until("the DaemonSet's FailedCreate event", partial(refused, RELEASE), 120)
        print(f"baseline: {message}")
        assert re.search(
            r'pods "ate-devplugin-[a-z0-9]+" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes '
            r'\(volumes "device-plugins", "host-dev", "pod-resources", "kvm-prober"\)$',
            message,
        ), message  # fmt: skip
        # The KVM prober (on by default) is refused alike, for its socket directory.
        prober = wait_until("the prober's FailedCreate event", partial(refused, f"{RELEASE}-kvm-prober"), 120)
        assert prober.endswith('violates PodSecurity "baseline:latest": hostPath volumes (volume "kvm-prober")'), prober
        described = user_cluster.kubectl("describe", "daemonset", "-n", NAMESPACE, RELEASE)
        assert 'violates PodSecurity "baseline:latest": hostPath volumes' in described, described
        assert not plugin_pods(user_cluster)
        notes = user_helm.run("status", RELEASE, "-n", NAMESPACE).stdout
        label = f"kubectl label namespace {NAMESPACE} --overwrite pod-security.kubernetes.io/enforce=privileged"
        assert label in notes, notes
        labelled = time.monotonic()
        user_cluster.kubectl(*label.split()[1:])
        wait_plugin_ready(user_cluster)
        print(f"refused {labelled - start:.1f}s after helm install; plugin pod ready "
              f"{time.monotonic() - labelled:.1f}s after the label")  # fmt: skip
    finally:
        user_helm.uninstall()
    wait_until("the plugin pods gone", lambda: not plugin_pods(user_cluster), 120)


# --- 1 again, with helm v4 ------------------------------------------------------------------


def test_helm_v4_install_and_uninstall(user_cluster: Cluster, registry: Registry, published: str) -> None:
    """chart/README.md's install command once more, with helm v4 as `helm`."""
    helm_v4 = users_helm("v4", user_cluster, registry)
    node = user_cluster.node
    start = time.monotonic()
    out = helm_v4.shell(doc_block("install"), user_cluster.dir)
    ready = [is_ready(p) for p in plugin_pods(user_cluster)]
    print(f"helm v4 install returned after {time.monotonic() - start:.1f}s with plugin pods Ready: {ready}")
    try:
        assert "rollout status daemonset/ate-devplugin" in out.stdout
        pod = wait_plugin_ready(user_cluster, node)
        node.wait_resource(RESOURCE, "4096")
        assert node.resource("capacity", RESOURCE) == "4096"
        assert registered(user_cluster, pod) == 1
    finally:
        helm_v4.uninstall()
    wait_until("the plugin pod gone", lambda: not user_cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    node.wait_resource(RESOURCE, "0")
    assert os.path.exists("/dev/kvm")
