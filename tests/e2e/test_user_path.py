"""The user's path on a real one-node cluster: the release published by tools/release.sh
to a real OCI registry, ``helm install`` of it with the very commands chart/README.md
prints, the node pulling the image from the registry, a pod that opens /dev/kvm without
privilege, a kubelet restart, a plugin pod replaced, ``helm upgrade``, ``helm uninstall``,
and a real Prometheus scraping the plugin through service discovery.

The tests run in file order and share one release (installed with helm v3 by the first
test, removed by the uninstall test); helm v4 installs and uninstalls it once more at the
end. Every install and upgrade names the published chart, and none sets an image: the
chart's default, ``ghcr.io/ate-dev/ate-devplugin:<version>``, is what the node pulls
(tests/e2e/registry.py serves that name inside the sandbox). Each test asserts what the
user would check with kubectl, curl and Prometheus.

The node's allocatable lags the plugin pod's Ready by up to the kubelet's node status
period (10 s by default): every test waits on allocatable itself, never on Ready alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import API, API_PORT_ON_BRIDGE, NODE, NODE_IP, Cluster, wait_until
from tests.e2e.monitoring import (
    EndpointsDiscovery,
    SandboxPrometheus,
    ServiceMonitorConfig,
    dashboard_queries,
    fill,
    rendered_service_monitor,
)
from tests.e2e.registry import Registry
from tests.e2e.userpath import (
    CHART,
    NAMESPACE,
    RELEASE,
    RESOURCE,
    Helm,
    consumer_pod,
    is_ready,
    kvm_rule,
    metrics,
    plugin_pods,
    run_consumer,
    sample,
    wait_plugin_ready,
    watch_exit_code,
)
from tests.harness.chart import doc_block, helm_path, prometheus_operator_crds
from tests.harness.image import BuiltImage, buildah
from tests.harness.monitoring import reads_dra, reads_pod_resources

REPO = Path(__file__).resolve().parents[2]
KVM_API_VERSION = 12  # what KVM_GET_API_VERSION has returned since Linux 2.6.22
TUN = "ate.dev/tun"
#: A group for the device node of scenario 3b (kvm's fixed GID on Fedora and RHEL).
KVM_GID = 36
EACCES = "PermissionError: [Errno 13] Permission denied: '/dev/kvm'"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
PUBLISHED_CHART = "oci://ghcr.io/ate-dev/charts/ate-devplugin"
IMAGE_REPOSITORY = "ate-dev/ate-devplugin"
PUBLISHED_IMAGE = f"ghcr.io/{IMAGE_REPOSITORY}:{VERSION}"


# --- 0. the release, published as tools/release.sh publishes it ------------------------------


def release(cluster: Cluster, registry: Registry, image: BuiltImage, path: str) -> str:
    """``REGISTRY=<path> tools/release.sh --push-only VERSION``: the session's image (built
    by tools/build-image.sh), labelled, under the release's name there, pushed by buildah,
    and the chart packaged and pushed by `helm push`."""
    helm_v3 = helm_path("v3")
    assert helm_v3 is not None
    home = cluster.dir / "release-helm"
    name = f"{path}/ate-devplugin:{VERSION}"
    # The session's image with one label more, so its own image ID: kubelet 1.35
    # (KubeletEnsureSecretPulledImages) checks pull credentials for every name of an image
    # ID it has pulled, so a pull of the very image the node has preloaded under
    # localhost/ate-devplugin:e2e would refuse that name to pods with pullPolicy Never.
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
def published(cluster: Cluster, registry: Registry, image: BuiltImage) -> str:
    """The release as the documentation names it: ghcr.io/ate-dev."""
    out = release(cluster, registry, image, "ghcr.io/ate-dev")
    assert registry.tags(IMAGE_REPOSITORY) == [VERSION]
    assert registry.tags("ate-dev/charts/ate-devplugin") == [VERSION]
    assert f"helm install ate-devplugin {PUBLISHED_CHART} --version {VERSION}" in out
    return out


@pytest.fixture(scope="module")
def helm(helm: Helm, registry: Registry, published: str) -> Helm:
    """helm v3 as the user runs it: the published chart, the chart's default image."""
    return dataclasses.replace(
        helm, chart=(PUBLISHED_CHART, "--version", VERSION), image_values=(), env=registry.client_env()
    )


@pytest.fixture(scope="module")
def helm_v4(helm_v4: Helm, registry: Registry, published: str) -> Helm:
    return dataclasses.replace(
        helm_v4, chart=(PUBLISHED_CHART, "--version", VERSION), image_values=(), env=registry.client_env()
    )


def node_images(cluster: Cluster) -> list[str]:
    return cluster.ctr("images", "ls", "-q").stdout.split()


@pytest.fixture(scope="module")
def installed(cluster: Cluster, helm: Helm) -> Iterator[dict[str, Any]]:
    """chart/README.md's install command, run as it is with helm v3; uninstalled at the end
    if a test did not do it."""
    assert not [i for i in node_images(cluster) if i.startswith("ghcr.io/")], "nothing of the release preloaded"
    start = time.monotonic()
    out = helm.shell(doc_block("install"), cluster.dir)
    ready = [is_ready(p) for p in plugin_pods(cluster)]
    record = {"notes": out.stdout, "helm_seconds": time.monotonic() - start, "ready_when_helm_returned": ready}
    try:
        yield record
    finally:
        if helm.run("status", "ate-devplugin", "-n", NAMESPACE, check=False).returncode == 0:
            helm.uninstall()


def registered(cluster: Cluster, pod: dict[str, Any], resource: str = RESOURCE) -> float | None:
    return sample(metrics(cluster, pod), "ate_devplugin_registered", resource_name=resource)


# --- 1. helm install ---------------------------------------------------------------------


def test_helm_install_makes_the_node_offer_kvm(
    cluster: Cluster, installed: dict[str, Any], helm: Helm, registry: Registry
) -> None:
    assert "rollout status daemonset/ate-devplugin" in installed["notes"], "NOTES say what to wait on"
    verify = helm.shell(doc_block("verify"), cluster.dir)  # the README's check, as printed
    assert "successfully rolled out" in verify.stdout
    pod = wait_plugin_ready(cluster)
    lag = cluster.wait_node_resource(RESOURCE, "4096")
    print(
        f"helm install returned after {installed['helm_seconds']:.1f}s with plugin pods Ready: "
        f"{installed['ready_when_helm_returned']}; allocatable 4096 {lag:.1f}s after the rollout"
    )
    table = helm.shell(doc_block("verify"), cluster.dir).stdout.splitlines()
    assert [row.split() for row in table[-2:]] == [["NODE", "KVM"], [NODE, "4096"]], table
    assert cluster.node_resource("capacity", RESOURCE) == "4096"
    assert registered(cluster, pod) == 1
    status, body = cluster.sandbox.http_get(f"http://{pod['status']['podIP']}:9477/readyz")
    assert status == 200, body


def test_the_node_pulled_the_published_image(cluster: Cluster, installed: dict[str, Any], registry: Registry) -> None:
    """The chart's default image, pulled by the node's containerd from the registry: the
    pod runs the very manifest the registry serves under the release's tag."""
    (pod,) = plugin_pods(cluster)
    (status,) = pod["status"]["containerStatuses"]
    assert pod["spec"]["containers"][0]["image"] == PUBLISHED_IMAGE
    digest = registry.manifest_digest(IMAGE_REPOSITORY, VERSION)
    assert status["imageID"] == f"ghcr.io/{IMAGE_REPOSITORY}@{digest}", status
    about = f"involvedObject.name={pod['metadata']['name']}"
    events = cluster.get_json("events", "-n", NAMESPACE, "--field-selector", about)
    pulled = [e["message"] for e in events["items"] if e["reason"] == "Pulled"]
    assert pulled, [e["reason"] for e in events["items"]]
    assert PUBLISHED_IMAGE in pulled[0]
    assert "already present" not in pulled[0], pulled
    assert PUBLISHED_IMAGE in node_images(cluster)


# --- 7 (started early: it watches the whole path). Prometheus through service discovery --


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, installed: dict[str, Any], helm: Helm) -> Iterator[SandboxPrometheus]:
    monitor = rendered_service_monitor(str(helm.path))
    discovery = EndpointsDiscovery(cluster, monitor["spec"]["namespaceSelector"]["matchNames"][0])
    discovery.start()
    prom = SandboxPrometheus(cluster, ServiceMonitorConfig(monitor, discovery.url))
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        discovery.stop()


def test_prometheus_finds_the_plugin_pod_with_the_service_monitor_labels(
    cluster: Cluster, prometheus: SandboxPrometheus
) -> None:
    (pod,) = plugin_pods(cluster)
    prometheus.wait_for_targets_up(timeout=120)
    samples = prometheus.wait_for('ate_devplugin_registered{resource_name="ate.dev/kvm"} == 1', timeout=60)
    labels = samples[0].labels
    assert labels["namespace"] == NAMESPACE
    assert labels["pod"] == pod["metadata"]["name"]
    assert labels["node"] == NODE
    assert labels["job"] == "ate-devplugin"


def test_a_release_elsewhere_names_its_own_image(
    cluster: Cluster, registry: Registry, image: BuiltImage, helm: Helm
) -> None:
    """Published under another path (a mirror, a fork), the chart's default image is the
    one pushed with it: the user installs it without setting an image."""
    release(cluster, registry, image, "ghcr.io/mirror")
    assert registry.tags("mirror/ate-devplugin") == [VERSION]
    out = helm.run("template", RELEASE, "oci://ghcr.io/mirror/charts/ate-devplugin", "--version", VERSION,
                   "--show-only", "templates/daemonset.yaml")  # fmt: skip
    ds = yaml.safe_load(out.stdout)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/mirror/ate-devplugin:{VERSION}"


# --- 1b. with kube-prometheus-stack, as chart/README.md says -------------------------------


@pytest.fixture
def monitoring_crds(cluster: Cluster, tmp_path: Path) -> Iterator[None]:
    """prometheus-operator's CRDs, as kube-prometheus-stack installs them; removed after."""
    try:
        crd_dir = prometheus_operator_crds(tmp_path)
    except LookupError as exc:
        pytest.fail(f"{exc} is needed for the kube-prometheus-stack commands")
    kinds = ("servicemonitors", "podmonitors", "prometheusrules")
    files = [str(crd_dir / f"monitoring.coreos.com_{k}.yaml") for k in kinds]
    for path in files:
        cluster.kubectl("apply", "--server-side", "-f", path)
    try:
        crds = [f"crd/{k}.monitoring.coreos.com" for k in kinds]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
        yield
    finally:
        for path in files:
            cluster.kubectl("delete", "--ignore-not-found", "-f", path, check=False)


def test_kube_prometheus_stack_commands_keep_the_image_and_the_pod(
    cluster: Cluster, installed: dict[str, Any], helm: Helm, monitoring_crds: None
) -> None:
    """The README's kube-prometheus-stack commands, run as printed: a values file and
    `helm upgrade --install` with it. The monitors get the label the stack's Prometheus
    selects on, the image stays the published one (no value of it was given, none is
    dropped), and the plugin pod is not even restarted: its template did not change."""
    (before,) = plugin_pods(cluster)
    try:
        helm.shell(doc_block("kube-prometheus-stack"), cluster.dir)
        for kind in ("servicemonitor", "prometheusrule"):
            (obj,) = cluster.get_json(kind, "-n", NAMESPACE)["items"]
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["metadata"]
        rule = cluster.get_json("prometheusrule", "-n", NAMESPACE)["items"][0]
        exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        assert 'up{job="ate-devplugin"} == 0' in exprs
        ds = cluster.get_json("daemonset", "-n", NAMESPACE, RELEASE)
        assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == PUBLISHED_IMAGE
        pod = wait_plugin_ready(cluster)
        assert pod["metadata"]["uid"] == before["metadata"]["uid"]
    finally:
        helm.upgrade()  # back to the defaults, before the CRDs go
    assert not cluster.get_json("servicemonitor", "-n", NAMESPACE)["items"]


# --- 1c. DRA against this API server: the egress it needs, and its admission policy --------


def test_dra_egress_and_policy_come_from_the_cluster(cluster: Cluster, helm: Helm) -> None:
    """What the chart renders for dra.mode=dra with egress restricted, looked up from this
    API server (helm's server-side dry run): egress to the `kubernetes` Service and to the
    API server behind it, and the admission policy, since this API server serves it."""
    # --dry-run=server: lookups reach the API server; --validate: its APIs are the Capabilities.
    out = helm.run("template", "dra-check", *helm.chart, "-n", NAMESPACE, "--dry-run=server", "--validate",
                   "--set", "dra.mode=dra", "--set", "networkPolicy.restrictEgress=true")  # fmt: skip
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d}
    egress = docs["NetworkPolicy"]["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]} in egress
    api = {"to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": [{"port": API_PORT_ON_BRIDGE, "protocol": "TCP"}]}
    assert api in egress, egress
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= set(docs)


def slice_manifest(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": "ate.dev", "nodeName": node, "devices": [],
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


def test_slice_policy_keeps_a_token_to_its_own_node(cluster: Cluster, installed: dict[str, Any], helm: Helm) -> None:
    """The chart's DRA RBAC and admission policy on this API server, exercised with a token
    bound to the running plugin pod (as the kubelet gives the driver its token): the slices
    of its node may be written, another node's may not."""
    (pod,) = plugin_pods(cluster)
    account = pod["spec"]["serviceAccountName"]
    # Another release name (the install's own is taken), for the running pod's ServiceAccount.
    out = helm.run("template", "dra-check", *helm.chart, "-n", NAMESPACE, "--dry-run=server", "--validate",
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
        result = cluster.sandbox.run([str(cluster.bin / "kubectl"), "--kubeconfig", str(driver), *args],
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
                as_driver("delete", "resourceslice", "policy-check-other")
                return None
            return text

        message = wait_until("the policy to refuse another node's slice", refused, 60, interval=1)
        assert "may write only that node's ResourceSlices, not those of node other-node" in message, message
        assert f"the DRA driver on node {NODE}" in message
        code, text = as_driver("create", "-f", "-", stdin=json.dumps(slice_manifest("policy-check-own", NODE)))
        assert code == 0, text
        code, text = as_driver("delete", "resourceslice", "policy-check-own")
        assert code == 0, text
        # Without the policy, RBAC alone lets the same token write another node's slice.
        for obj in objects:
            if obj["kind"].startswith("ValidatingAdmissionPolicy"):
                cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"])
        allowed = lambda: as_driver("create", "-f", "-", stdin=other)[0] == 0  # noqa: E731
        wait_until("RBAC alone to allow it", allowed, 60, interval=1)
    finally:
        cluster.kubectl("delete", "resourceslice", "policy-check-own", "policy-check-other", "--ignore-not-found",
                        check=False)  # fmt: skip
        for obj in objects:
            cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)


# --- 2. a consumer pod --------------------------------------------------------------------


def test_example_pod_opens_kvm_without_privilege(cluster: Cluster, installed: dict[str, Any]) -> None:
    """The example as shipped: uid 10001, no capability, no privilege escalation, admitted
    under the restricted Pod Security Standard; the node's /dev/kvm is 0600 root:root and
    containerd sets device_ownership_from_security_context (the default of this cluster)."""
    result = run_consumer(cluster, consumer_pod("kvm-consumer"))
    assert result["phase"] == "Succeeded", result
    assert result["uid"] == 10001
    assert result["cap_eff"] == "0000000000000000"
    assert result["no_new_privs"] == "1"
    assert result.get("api_version") == KVM_API_VERSION, result
    assert result["node"][1:] == [10001, 10001, 10, 232], result["node"]
    assert kvm_rule(result["devices_list"]) == ["c 10:232 rw"], result["devices_list"]


def test_pod_without_the_request_has_no_kvm(cluster: Cluster, installed: dict[str, Any]) -> None:
    result = run_consumer(cluster, consumer_pod("no-kvm", request=False))
    assert result["node"] == "FileNotFoundError: [Errno 2] No such file or directory: '/dev/kvm'"
    assert kvm_rule(result["devices_list"]) == []


# --- 3. non-root consumers on a node where /dev/kvm is 0600 root:root -------------------


@contextlib.contextmanager
def containerd_device_ownership(cluster: Cluster, enabled: bool) -> Iterator[None]:
    cluster.restart_containerd(device_ownership=enabled)
    try:
        yield
    finally:
        cluster.restart_containerd(device_ownership=True)


@contextlib.contextmanager
def kvm_node_with_group(cluster: Cluster, gid: int) -> Iterator[None]:
    """/dev/kvm as distributions with a kvm group make it (0660 root:kvm), in the sandbox's
    mount namespace only: a node of the same major:minor bind-mounted over it."""
    node = "/run/ate-e2e-kvm"
    cluster.sandbox.run(["sh", "-ec", f"mknod -m 0660 {node} c 10 232; chown 0:{gid} {node}; "
                                      f"mount --bind {node} /dev/kvm; stat -c '%a %u:%g %t:%T' /dev/kvm"])  # fmt: skip
    try:
        yield
    finally:
        cluster.sandbox.run(["sh", "-ec", f"umount /dev/kvm; rm -f {node}"])


def test_non_root_pod_without_device_ownership_is_refused(cluster: Cluster, installed: dict[str, Any]) -> None:
    with containerd_device_ownership(cluster, enabled=False):
        result = run_consumer(cluster, consumer_pod("kvm-no-ownership"))
    assert result["node"][:3] == ["crw-------", 0, 0], result["node"]
    assert result["error"] == EACCES
    assert result["phase"] == "Succeeded"  # the check script reports, it does not crash


def test_non_root_pod_with_the_device_group_as_supplemental_group(cluster: Cluster, installed: dict[str, Any]) -> None:
    with containerd_device_ownership(cluster, enabled=False), kvm_node_with_group(cluster, KVM_GID):
        with_group = run_consumer(cluster, consumer_pod("kvm-group", supplemental_groups=(KVM_GID,)))
        without = run_consumer(cluster, consumer_pod("kvm-no-group"))
    assert with_group["node"][:3] == ["crw-rw----", 0, KVM_GID], with_group["node"]
    assert KVM_GID in with_group["groups"]
    assert with_group.get("api_version") == KVM_API_VERSION, with_group
    assert without["error"] == EACCES


# --- 4. kubelet restart, plugin pod replaced ---------------------------------------------


def heartbeat(cluster: Cluster, node: dict[str, Any] | None = None) -> str:
    """When the kubelet last posted the node's status (its Ready condition's heartbeat)."""
    node = node or cluster.get_json("node", NODE)
    beat: str = next(c["lastHeartbeatTime"] for c in node["status"]["conditions"] if c["type"] == "Ready")
    return beat


def test_kubelet_restart_needs_no_plugin_restart(cluster: Cluster, installed: dict[str, Any]) -> None:
    (pod,) = plugin_pods(cluster)
    restarts_before = pod["status"]["containerStatuses"][0]["restartCount"]
    assert sample(metrics(cluster, pod), "ate_devplugin_kubelet_restarts_total") == 0
    beat_before = heartbeat(cluster)
    cluster.stop_kubelet(signal.SIGKILL)
    cluster.start_kubelet()
    cluster.wait_node_ready()
    wait_until("the plugin to see the restart",
               lambda: sample(metrics(cluster, pod), "ate_devplugin_kubelet_restarts_total") == 1, 120)  # fmt: skip
    wait_until("registered again", lambda: registered(cluster, pod) == 1, 120)

    def fresh_allocatable() -> bool:
        # A node status the restarted kubelet posted (it posts one when it starts, and
        # again when allocatable changes), with the plugin registered.
        node = cluster.get_json("node", NODE)
        return heartbeat(cluster, node) != beat_before and node["status"]["allocatable"].get(RESOURCE) == "4096"

    wait_until("allocatable 4096 from the restarted kubelet", fresh_allocatable, 120)
    (same,) = plugin_pods(cluster)
    assert same["metadata"]["uid"] == pod["metadata"]["uid"]
    assert same["status"]["containerStatuses"][0]["restartCount"] == restarts_before
    result = run_consumer(cluster, consumer_pod("kvm-after-kubelet-restart"))
    assert result.get("api_version") == KVM_API_VERSION, result


# --- a device that goes away and comes back ------------------------------------------------

PRIVATE_DEV = "/run/ate-e2e-dev"  # in the sandbox's tmpfs: the host's /dev is never touched


def test_device_gone_and_back_is_seen_by_the_node(
    cluster: Cluster, installed: dict[str, Any], helm: Helm, prometheus: SandboxPrometheus
) -> None:
    """A device node that disappears (a module unloaded) and comes back. The host's /dev
    must stay as it is, so the plugin watches a device directory of the sandbox's own
    (hostPaths.dev) holding a node of /dev/kvm's major:minor; pods still get /dev/kvm."""
    kvm = f"{PRIVATE_DEV}/kvm"
    cluster.sandbox.run(["sh", "-ec", f"mkdir -p {PRIVATE_DEV}; mknod -m 0600 {kvm} c 10 232"])
    helm.upgrade("--set", f"hostPaths.dev={PRIVATE_DEV}")
    try:
        pod = wait_plugin_ready(cluster)
        wait_until("registered", lambda: registered(cluster, pod) == 1, 120)
        cluster.wait_node_resource(RESOURCE, "4096")
        # Prometheus must see the counters before and after, or increase() has nothing to show.
        changes = f'ate_devplugin_device_health_changes_total{{pod="{pod["metadata"]["name"]}", health="%s"}}'
        prometheus.wait_for(changes % "unhealthy" + " == 0", timeout=120)
        cluster.sandbox.run(["rm", kvm])
        cluster.wait_node_resource(RESOURCE, "0")
        assert cluster.node_resource("capacity", RESOURCE) == "4096"
        values = metrics(cluster, pod)
        assert sample(values, "ate_devplugin_devices", resource_name=RESOURCE, health="unhealthy") == 4096
        cluster.sandbox.run(["mknod", "-m", "0600", kvm, "c", "10", "232"])
        cluster.wait_node_resource(RESOURCE, "4096")
        values = metrics(cluster, pod)
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="unhealthy")
        assert sample(values, "ate_devplugin_device_health_changes_total", resource_name=RESOURCE, health="healthy")
        prometheus.wait_for(changes % "healthy" + " >= 1", timeout=120)
    finally:
        helm.upgrade()
    wait_plugin_ready(cluster)
    cluster.wait_node_resource(RESOURCE, "4096")


# --- 7. every dashboard query has data -----------------------------------------------------


def test_every_dashboard_query_returns_data_from_the_cluster(cluster: Cluster, prometheus: SandboxPrometheus) -> None:
    values = {"$__rate_interval": "1m", "$__range": "1h", "$cluster": "", "$job": "ate-devplugin", "$node": NODE,
              "$instance": ".+",
              "$resource": RESOURCE.replace(".", "\\\\.")}  # fmt: skip
    # The plugin pod was just replaced (previous test): wait until its own series are in.
    (pod,) = plugin_pods(cluster)
    prometheus.wait_for(f'ate_devplugin_registered{{pod="{pod["metadata"]["name"]}"}} == 1', timeout=120)
    end = time.time()
    empty, checked = [], 0
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for where, expr, instant in dashboard_queries(json.loads(path.read_text())):
            if reads_pod_resources(expr) or reads_dra(expr):
                continue  # off by default: test_pods_holding_units.py and test_dra.py run these
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


def test_deleted_plugin_pod_exits_0_and_is_replaced(cluster: Cluster, installed: dict[str, Any]) -> None:
    (old,) = plugin_pods(cluster)
    code, took = watch_exit_code(cluster, old["metadata"]["name"])
    assert code == 0, f"the deleted plugin pod's container exited {code}"
    new = wait_plugin_ready(cluster)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    wait_until("the new pod registered", lambda: registered(cluster, new) == 1, 120)
    cluster.wait_node_resource(RESOURCE, "4096")
    result = run_consumer(cluster, consumer_pod("kvm-after-new-plugin-pod"))
    assert result.get("api_version") == KVM_API_VERSION, result
    print(f"plugin pod deleted in {took:.1f}s")


# --- 5. helm upgrade ------------------------------------------------------------------------


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
def two_resources(cluster: Cluster) -> str:
    """A values file adding /dev/net/tun as ate.dev/tun next to /dev/kvm."""
    path = cluster.dir / "two-resources.yaml"
    path.write_text(TWO_RESOURCES)
    return str(path)


def test_helm_upgrade_adding_a_resource_rolls_out(
    cluster: Cluster, installed: dict[str, Any], helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=true: the config checksum changed, so the pod is replaced."""
    (old,) = plugin_pods(cluster)
    helm.upgrade("-f", two_resources, "--set", "deviceConfig.restartOnChange=true")
    wait_until(
        "the rolled-out plugin pod",
        lambda: next((p for p in plugin_pods(cluster) if p["metadata"]["uid"] != old["metadata"]["uid"]), None),
        240,
    )
    pod = wait_plugin_ready(cluster)
    wait_until("both resources registered", lambda: registered(cluster, pod, TUN) == 1, 120)
    assert registered(cluster, pod) == 1
    cluster.wait_node_resource(TUN, "16")
    assert cluster.node_resource("allocatable", RESOURCE) == "4096"


def test_helm_upgrade_changing_a_resource_is_picked_up_live(
    cluster: Cluster, installed: dict[str, Any], helm: Helm, two_resources: str
) -> None:
    """deviceConfig.restartOnChange=false: the same pod reads the updated ConfigMap. The
    kubelet refreshes ConfigMap volumes on its pod sync (every minute by default)."""
    live = ("-f", two_resources, "--set", "deviceConfig.restartOnChange=false")
    helm.upgrade(*live)  # without the checksum annotation: the pod template changes once
    wait_plugin_ready(cluster)
    cluster.wait_node_resource(TUN, "16")
    (before,) = plugin_pods(cluster)
    start = time.monotonic()
    helm.upgrade(*live, "--set", "deviceConfig.resources[1].units=32")
    waited = cluster.wait_node_resource(TUN, "32", timeout=300)
    (after,) = plugin_pods(cluster)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert (
        after["status"]["containerStatuses"][0]["restartCount"]
        == before["status"]["containerStatuses"][0]["restartCount"]
    )
    assert cluster.node_resource("allocatable", RESOURCE) == "4096"
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
    cluster: Cluster, installed: dict[str, Any], helm: Helm, two_resources: str, value: str, field: str
) -> None:
    (before,) = plugin_pods(cluster)
    tun = cluster.node_resource("allocatable", TUN)
    out = helm.upgrade("-f", two_resources, "--set", value, check=False)
    assert out.returncode != 0
    assert field in out.stderr, out.stderr
    (after,) = plugin_pods(cluster)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert cluster.node_resource("allocatable", RESOURCE) == "4096"
    assert cluster.node_resource("allocatable", TUN) == tun


# --- 6. helm uninstall ----------------------------------------------------------------------


def sockets(cluster: Cluster) -> list[str]:
    out = cluster.sandbox.run(["ls", "/var/lib/kubelet/device-plugins"]).stdout
    return sorted(name for name in out.split() if name.startswith("ate-"))


def test_helm_uninstall_removes_the_socket_and_the_resource(
    cluster: Cluster, installed: dict[str, Any], helm: Helm
) -> None:
    assert len(plugin_pods(cluster)) == 1
    assert sockets(cluster), "the plugin's sockets before uninstall"
    helm.uninstall()
    wait_until("the plugin pod gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    assert sockets(cluster) == []
    cluster.wait_node_resource(RESOURCE, "0")
    cluster.wait_node_resource(TUN, "0")


# --- 1 again, with helm v4 ------------------------------------------------------------------


def test_helm_v4_install_and_uninstall(cluster: Cluster, helm_v4: Helm) -> None:
    """chart/README.md's install command once more, with helm v4 as `helm`."""
    start = time.monotonic()
    out = helm_v4.shell(doc_block("install"), cluster.dir)
    ready = [is_ready(p) for p in plugin_pods(cluster)]
    print(f"helm v4 install returned after {time.monotonic() - start:.1f}s with plugin pods Ready: {ready}")
    try:
        assert "rollout status daemonset/ate-devplugin" in out.stdout
        pod = wait_plugin_ready(cluster)
        cluster.wait_node_resource(RESOURCE, "4096")
        assert cluster.node_resource("capacity", RESOURCE) == "4096"
        assert registered(cluster, pod) == 1
    finally:
        helm_v4.uninstall()
    wait_until("the plugin pod gone", lambda: not cluster.get_json("pods", "-n", NAMESPACE)["items"], 120)
    cluster.wait_node_resource(RESOURCE, "0")
    assert os.path.exists("/dev/kvm")
