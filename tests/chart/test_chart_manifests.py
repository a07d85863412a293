"""Every rendered object against the real schemas: the Kubernetes API of each supported
version (kubernetes-validate, strict), the prometheus-operator CRDs (monitoring.coreos.com/v1)
for ServiceMonitor, PodMonitor and PrometheusRule; the DaemonSet's security settings; checkov
on the rendered manifests (every skip justified in the chart); the consumer example pod."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.harness.chart import (
    CI_VALUES,
    REPO,
    Helm,
    Manifest,
    _minor,
    by_kind,
    daemonsets,
    oldest_supported_k8s,
    one,
    pool_values,
    supported_k8s_versions,
    the_daemons,
)
from tests.harness.kubelet import KNOWN_VERSIONS

K8S_VERSIONS = supported_k8s_versions()
EXAMPLE_POD = REPO / "docs" / "examples" / "kvm-consumer-pod.yaml"

# checkov checks the chart skips, and when. Adding one here is a review decision: the
# reason lives in templates/_helpers.tpl ("ate-devplugin.checkovSkips").
ALWAYS_SKIPPED = {"CKV_K8S_23", "CKV_K8S_40"}  # UID 0 (root-owned kubelet socket directory)
SKIPPED_WITHOUT_DIGEST = {"CKV_K8S_43", "CKV_K8S_15"}
SKIPPED_WITHOUT_NETWORK_POLICY = {"CKV2_K8S_6"}


def test_kubernetes_versions_cover_the_oldest_supported_and_later() -> None:
    major, minor = oldest_supported_k8s()
    assert f"{major}.{minor}" == KNOWN_VERSIONS[0], "kubeVersion admits what the kubelet bench does not prove"
    assert K8S_VERSIONS[0].startswith(f"{major}.{minor}."), K8S_VERSIONS
    assert len(K8S_VERSIONS) > 1, K8S_VERSIONS


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_objects_valid_for_kubernetes(
    any_helm: Helm, ci_values: Path, version: str, k8s_validate: Callable[[Manifest, str], None]
) -> None:
    docs = any_helm.template([ci_values])
    checked = 0
    for doc in docs:
        pod = doc["spec"] if doc["kind"] == "Pod" else doc.get("spec", {}).get("template", {}).get("spec", {})
        claims = "resourceClaims" in pod  # the helm test pod and the KVM prober, dra mode
        if (doc["apiVersion"] == "resource.k8s.io/v1" or claims) and _minor(version) < (1, 34):
            checked += 1  # DRA mode needs 1.34 (the chart refuses to render it for older releases)
            continue
        if doc["kind"].startswith("ValidatingAdmissionPolicy") and _minor(version) < (1, 30):
            checked += 1  # admissionregistration.k8s.io/v1 since 1.30: rendered only where served
            continue
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "nfd.k8s-sigs.io/")):
            # Their metadata is still a Kubernetes ObjectMeta: check it on a ConfigMap.
            doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}
        k8s_validate(doc, version)
        checked += 1
    assert checked == len(docs)


def test_monitoring_objects_valid_for_crds(helm: Helm, ci_values: Path, monitoring_schemas: dict[str, Any]) -> None:
    for doc in helm.template([ci_values]):
        if doc["apiVersion"] != "monitoring.coreos.com/v1":
            continue
        jsonschema.Draft7Validator(monitoring_schemas[doc["kind"]]).validate(doc)


def test_ci_files_render_every_monitoring_kind(any_helm: Helm) -> None:
    kinds = {d["kind"] for path in CI_VALUES for d in any_helm.template([path])}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy", "Service"} <= kinds


def test_crd_schema_catches_typos(any_helm: Helm, monitoring_schemas: dict[str, Any]) -> None:
    """The strict CRD schema is not vacuous: a misspelt field is refused."""
    docs = any_helm.template(sets=["forceMonitoringApi=true", "serviceMonitor.enabled=true"])
    sm = one(docs, "ServiceMonitor")
    sm["spec"]["endpoints"][0]["relabellings"] = sm["spec"]["endpoints"][0].pop("relabelings")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(monitoring_schemas["ServiceMonitor"]).validate(sm)


# --- the DaemonSet's security --------------------------------------------------------------


def _container(ds: Manifest) -> Manifest:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    result: Manifest = container
    return result


def test_daemonset_security(helm: Helm, ci_values: Path) -> None:
    docs = helm.template([ci_values])
    for ds in daemonsets(docs):
        check_daemonset_security(ds, pool_values(yaml.safe_load(ci_values.read_text()) or {}, ds))
    for sa in by_kind(docs, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False


def check_daemonset_security(ds: Manifest, values: dict[str, Any]) -> None:
    pod = ds["spec"]["template"]["spec"]
    c = _container(ds)
    sc = c["securityContext"]

    assert sc.get("privileged", False) is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc["capabilities"].get("add")
    assert sc["runAsUser"] == 0, "UID 0: the kubelet's socket directory is root-owned"
    seccomp = sc.get("seccompProfile") or pod["securityContext"].get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    assert pod["hostNetwork"] is False
    assert pod["hostPID"] is False
    assert pod["hostIPC"] is False
    mode = values.get("dra", {}).get("mode", "device-plugin")
    # Only the DRA driver calls the API server (test_chart_dra.py checks its RBAC).
    assert pod["automountServiceAccountToken"] is (mode != "device-plugin")
    assert not c.get("ports", [{}])[0].get("hostPort")

    # The socket directory (rw) and /dev (ro, as the device root); the CDI spec directory
    # (rw) when a resource answers with CDI or the daemon is a DRA driver; the DRA driver's
    # two directories; the kubelet's pod-resources directory (ro) only while pods holding
    # units are read.
    host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    resources = values.get("deviceConfig", {}).get("resources", [])
    uses_cdi = (
        values.get("cdi", {}).get("mount")
        or any(r.get("allocate", "devices") != "devices" for r in resources)
        or mode != "device-plugin"
    )
    pod_resources = values.get("podResources", {}).get("enabled", True)
    kvm_probe = values.get("kvmProbe", {}).get("enabled", True)
    nfd = values.get("nfd", {}).get("enabled", False)
    dra_paths = {"dra-registry", "dra-plugin"}
    if mode != "device-plugin":
        assert {n: host_paths.pop(n)["path"] for n in dra_paths} == {
            "dra-registry": "/var/lib/kubelet/plugins_registry",
            "dra-plugin": "/var/lib/kubelet/plugins/ate.dev",
        }
    # The device plugin API's directory: the resources' sockets, or in dra mode the prober's resource's.
    expected = {"host-dev"} if mode == "dra" and not kvm_probe else {"device-plugins", "host-dev"}
    assert set(host_paths) == expected | ({"cdi"} if uses_cdi else set()) | (
        {"pod-resources"} if pod_resources else set()
    ) | ({"kvm-prober"} if kvm_probe else set()) | ({"nfd-features"} if nfd else set())
    assert host_paths["host-dev"]["path"] == "/dev"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["host-dev"]["mountPath"] == "/host/dev"
    assert mounts["host-dev"]["readOnly"] is True
    if "device-plugins" in expected:
        assert host_paths["device-plugins"]["path"].endswith("/device-plugins")
        assert not mounts["device-plugins"].get("readOnly")
        assert mounts["device-plugins"]["mountPath"] == host_paths["device-plugins"]["path"]
    assert mounts["config"]["readOnly"] is True
    assert "subPath" not in mounts["config"], "a subPath mount never sees ConfigMap updates"
    assert c["args"][0] == "run"
    assert "--device-root=/host/dev" in c["args"]
    assert "--config=/etc/ate-devplugin/config.yaml" in c["args"]
    cdi_dir = values.get("hostPaths", {}).get("cdi", "/var/run/cdi")
    assert f"--cdi-dir={cdi_dir}" in c["args"]
    if uses_cdi:
        assert host_paths["cdi"] == {"path": cdi_dir, "type": "DirectoryOrCreate"}
        assert mounts["cdi"]["mountPath"] == cdi_dir
        assert not mounts["cdi"].get("readOnly")
    if pod_resources:
        assert mounts["pod-resources"]["readOnly"] is True
        assert mounts["pod-resources"]["mountPath"] == host_paths["pod-resources"]["path"]
        assert host_paths["pod-resources"]["path"].endswith("/pod-resources")
        assert f"--pod-resources-socket={host_paths['pod-resources']['path']}/kubelet.sock" in c["args"]
        assert "--pod-resources=on" in c["args"]
    else:
        assert "--pod-resources=off" in c["args"]

    features_dir = values.get("nfd", {}).get("featuresDir", "/etc/kubernetes/node-feature-discovery/features.d")
    if nfd:  # nfd-worker's features.d, read-write: the daemon replaces its feature file there
        assert host_paths["nfd-features"] == {"path": features_dir, "type": "DirectoryOrCreate"}
        assert mounts["nfd-features"]["mountPath"] == features_dir
        assert not mounts["nfd-features"].get("readOnly")
        assert f"--nfd-features-dir={features_dir}" in c["args"]
    else:
        assert not [a for a in c["args"] if a.startswith("--nfd-features-dir")]

    # Rendered without a cluster: what every release takes (1.37's overlap: test_chart_offline.py).
    strategy = ds["spec"]["updateStrategy"]
    assert "--socket-suffix=$(K8S_POD_UID)" not in c["args"]
    if strategy["type"] == "RollingUpdate":
        assert strategy["rollingUpdate"]["maxSurge"] == 0
        assert strategy["rollingUpdate"]["maxUnavailable"] == 1

    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]


def test_daemonset_defaults(any_helm: Helm) -> None:
    ds = the_daemons(any_helm.template(kube_version="1.35.4"), "DaemonSet")  # 1.37's rollout: the test below
    pod = ds["spec"]["template"]["spec"]
    c = _container(ds)
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"], "must run on every node, tainted ones too"
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert c["ports"] == [{"name": "metrics", "containerPort": 9477, "protocol": "TCP"}]
    assert "--metrics-address=0.0.0.0:9477" in c["args"]
    chart = yaml.safe_load((REPO / "chart" / "Chart.yaml").read_text())
    assert c["image"] == f"ghcr.io/ate-dev/ate-devplugin:{chart['appVersion']}"


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        ([], "ghcr.io/ate-dev/ate-devplugin:{v}"),
        (["image.registry=registry.example.com:5000", "image.repository=platform/ate-devplugin"],
         "registry.example.com:5000/platform/ate-devplugin:{v}"),
        # A repository naming its own registry, as before image.registry had a default.
        (["image.repository=registry.example.com/ate-devplugin", "image.tag=1.2.3"],
         "registry.example.com/ate-devplugin:1.2.3"),
        (["image.repository=localhost/ate-devplugin", "image.tag=e2e"], "localhost/ate-devplugin:e2e"),
        (["image.registry=", "image.repository=ate-devplugin"], "ate-devplugin:{v}"),
        (["image.repository=team/ate-devplugin"], "ghcr.io/team/ate-devplugin:{v}"),
        # global.imageRegistry wins over image.registry (prometheus-node-exporter's precedence) ...
        (["global.imageRegistry=mirror.example.com"], "mirror.example.com/ate-dev/ate-devplugin:{v}"),
        (["global.imageRegistry=mirror.example.com:5000", "image.registry=registry.example.com"],
         "mirror.example.com:5000/ate-dev/ate-devplugin:{v}"),
        # ... but not over a repository that names its own registry.
        (["global.imageRegistry=mirror.example.com", "image.repository=localhost/ate-devplugin", "image.tag=e2e"],
         "localhost/ate-devplugin:e2e"),
        # The default repository is the home's owner's.
        (["home=https://github.com/Platform-Team/ate-devplugin"], "ghcr.io/platform-team/ate-devplugin:{v}"),
    ],
)  # fmt: skip
def test_image_reference(any_helm: Helm, sets: list[str], image: str) -> None:
    version = yaml.safe_load((REPO / "chart" / "Chart.yaml").read_text())["appVersion"]
    (ds,) = daemonsets(any_helm.template(sets=sets))
    assert _container(ds)["image"] == image.format(v=version)


def pod_specs(docs: list[Manifest]) -> dict[str, Manifest]:
    """Every pod the chart makes, by its owner's kind and name: the DaemonSets', the uninstall
    hook Job's, the helm test pods."""
    specs = {}
    for doc in docs:
        if doc["kind"] == "Pod":
            specs[f"Pod/{doc['metadata']['name']}"] = doc["spec"]
        elif "template" in doc.get("spec", {}):
            specs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]["spec"]
    return specs


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_pull_secrets_global_and_the_charts_go_on_every_pod(
    any_helm: Helm, write_values: Callable[[str], Path], mode: str
) -> None:
    """global.imagePullSecrets as a parent chart shares them (names, or objects with a name),
    then imagePullSecrets, each name once, on every pod; none of either: no field."""
    sets = [f"dra.mode={mode}", "kvmProbe.enabled=true"]
    secrets = write_values("global: {imagePullSecrets: [mirror, {name: regcred}]}\n"
                           "imagePullSecrets: [{name: regcred}, {name: own}]\n")  # fmt: skip
    docs = any_helm.template([secrets], sets=sets)
    specs = pod_specs(docs)
    kinds = {k.split("/")[0] for k in specs}
    assert kinds == ({"DaemonSet", "Pod", "Job"} if mode == "dra" else {"DaemonSet", "Pod"}), specs.keys()
    assert len([k for k in specs if k.startswith("DaemonSet/")]) == 2  # the daemon's and the prober's
    for where, spec in specs.items():
        assert spec["imagePullSecrets"] == [{"name": "mirror"}, {"name": "regcred"}, {"name": "own"}], where
    for where, spec in pod_specs(any_helm.template(sets=sets)).items():
        assert "imagePullSecrets" not in spec, where


@pytest.mark.parametrize(
    ("kube", "mode", "overlap"),
    [("1.35.4", "device-plugin", False), ("1.36.3", "device-plugin", False), ("1.37.2", "device-plugin", True),
     ("1.37.2", "both", False), ("1.37.2", "dra", False)],
)  # fmt: skip
def test_pods_overlap_in_a_rollout_only_where_the_kubelet_keeps_both(
    any_helm: Helm, kube: str, mode: str, overlap: bool
) -> None:
    ds = the_daemons(any_helm.template(sets=[f"dra.mode={mode}"], kube_version=kube), "DaemonSet")
    rolling = ds["spec"]["updateStrategy"]["rollingUpdate"]
    suffixed = "--socket-suffix=$(K8S_POD_UID)" in _container(ds)["args"]
    if overlap:
        assert (rolling, suffixed) == ({"maxSurge": 1, "maxUnavailable": 0}, True)
    else:
        assert (rolling, suffixed) == ({"maxSurge": 0, "maxUnavailable": 1}, False)
    [uid] = [e for e in _container(ds)["env"] if e["name"] == "K8S_POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_cdi_directory_is_mounted_only_when_cdi_is_used(
    any_helm: Helm, write_values: Callable[[str], Path]
) -> None:
    def cdi_volumes(text: str) -> list[Manifest]:
        pod = the_daemons(any_helm.template([write_values(text)]), "DaemonSet")["spec"]["template"]["spec"]
        return [v for v in pod["volumes"] if v["name"] == "cdi"]

    devices_only = "deviceConfig: {resources: [{name: ate.dev/kvm, devices: [/dev/kvm], allocate: devices}]}"
    assert cdi_volumes(devices_only) == []
    assert cdi_volumes("{}") == []
    both = (
        "deviceConfig: {resources: [{name: ate.dev/kvm, devices: [/dev/kvm]},"
        " {name: a.b/c, devices: [/dev/c], allocate: both}]}"
    )
    assert [v["hostPath"]["path"] for v in cdi_volumes(both)] == ["/var/run/cdi"]
    # An existingConfigMap's resources are not seen by the chart: cdi.mount says it.
    existing = "deviceConfig: {existingConfigMap: mine}\ncdi: {mount: true}"
    assert [v["hostPath"]["type"] for v in cdi_volumes(existing)] == ["DirectoryOrCreate"]


def test_downward_api_and_otel_env(helm: Helm, ci_values: Path) -> None:
    for ds in daemonsets(helm.template([ci_values])):
        check_env(ds)


def check_env(ds: Manifest) -> None:
    c = _container(ds)
    env = {e["name"]: e for e in c["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["K8S_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["K8S_NAMESPACE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    names = [e["name"] for e in c["env"]]
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
    for attr, var in (
        ("k8s.node.name", "K8S_NODE_NAME"),
        ("k8s.pod.name", "K8S_POD_NAME"),
        ("k8s.namespace.name", "K8S_NAMESPACE_NAME"),
    ):
        assert attrs[attr] == f"$({var})"
        # $(VAR) is expanded only from variables defined earlier in the list.
        assert names.index(var) < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert attrs["k8s.daemonset.name"] == ds["metadata"]["name"]
    assert env["OTEL_SERVICE_NAME"]["value"]
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in env:
        assert "OTEL_SDK_DISABLED" not in env
    else:
        assert env["OTEL_SDK_DISABLED"]["value"] == "true"


def test_a_config_change_rolls_pods_only_when_asked(any_helm: Helm, write_values: Callable[[str], Path]) -> None:
    """Default: a new config changes the ConfigMap only, never the pod template (no
    rollout: each daemon reloads the file live and keeps its last good config).
    restartOnChange=true: the pod template follows the config's checksum."""
    changed = "resources: [{name: ate.dev/kvm, devices: [/dev/kvm], units: 10}]"

    def render(values: str) -> tuple[Manifest, Manifest]:
        docs = any_helm.template([write_values(values)])
        return the_daemons(docs, "DaemonSet"), _config_maps(docs)[0]

    base_ds, base_cm = render("{}")
    new_ds, new_cm = render(f"deviceConfig: {{{changed}}}")
    assert new_cm["data"] != base_cm["data"]
    assert new_ds == base_ds
    assert "checksum/config" not in (base_ds["spec"]["template"]["metadata"].get("annotations") or {})

    def checksum(values: str) -> str | None:
        ds, _ = render(values)
        value: str | None = (ds["spec"]["template"]["metadata"].get("annotations") or {}).get("checksum/config")
        return value

    base = checksum("deviceConfig: {restartOnChange: true}")
    assert base
    assert checksum(f"deviceConfig: {{restartOnChange: true, {changed}}}") not in {None, base}
    assert checksum("deviceConfig: {restartOnChange: true}\ndaemon: {logLevel: debug}") == base


def _config_maps(docs: list[Manifest]) -> list[Manifest]:
    """The ConfigMaps holding the daemon's config (not the dashboards)."""
    return [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]


def test_config_map_holds_the_daemon_config(helm: Helm) -> None:
    (cm,) = _config_maps(helm.template())
    config = yaml.safe_load(cm["data"]["config.yaml"])
    kvm = {"name": "ate.dev/kvm", "devices": ["/dev/kvm"], "units": 4096, "permissions": "rw"}
    assert config == {"version": 1, "resources": [kvm]}


def test_existing_config_map_is_used(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["deviceConfig.existingConfigMap=site-config"])
    assert not _config_maps(docs)
    pod = the_daemons(docs, "DaemonSet")["spec"]["template"]["spec"]
    (config,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == "site-config"


# --- checkov --------------------------------------------------------------------------------


def _expected_skips(values: dict[str, Any]) -> set[str]:
    skips = set(ALWAYS_SKIPPED)
    image = values.get("image", {})
    if not image.get("digest"):
        skips.add("CKV_K8S_43")
        if image.get("pullPolicy", "IfNotPresent") != "Always":
            skips.add("CKV_K8S_15")
    if not values.get("resources", {}).get("limits", {}).get("cpu"):
        skips.add("CKV_K8S_11")
    if values.get("networkPolicy", {}).get("enabled") is False:
        skips |= SKIPPED_WITHOUT_NETWORK_POLICY
    if values.get("kvmProbe", {}).get("enabled", True):
        skips |= {"CKV_K8S_8", "CKV_K8S_9"}  # the prober serves nothing to probe
    if values.get("test", {}).get("enabled", True):
        skips |= {"CKV2_K8S_6", "CKV_K8S_8", "CKV_K8S_9"}  # the helm test pod (templates/tests)
    if values.get("dra", {}).get("mode", "device-plugin") != "device-plugin":
        skips.add("CKV_K8S_38")  # the DRA driver's token, and the uninstall hook's
        skips.add("CKV2_K8S_6")  # the uninstall hook's pod, which listens on nothing
    return skips


def test_checkov_passes(
    any_helm: Helm, ci_values: Path, tmp_path: Path, checkov: Callable[[Path], dict[str, Any]]
) -> None:
    (tmp_path / "rendered.yaml").write_text(any_helm.template_text([ci_values]))
    report = checkov(tmp_path)
    results = report["results"]
    failed = [f"{c['check_id']} {c['check_name']} ({c['resource']})" for c in results["failed_checks"]]
    assert not failed, "checkov findings:\n" + "\n".join(failed)
    assert not results["parsing_errors"]
    assert report["summary"]["passed"] > 50, "checkov ran suspiciously few checks"

    skipped = {c["check_id"]: c["check_result"].get("suppress_comment", "") for c in results["skipped_checks"]}
    values = yaml.safe_load(ci_values.read_text()) or {}
    assert set(skipped) == _expected_skips(values)
    for check_id, reason in skipped.items():
        assert len(reason) >= 40, f"{check_id} is skipped without a real reason: {reason!r}"


# --- the consumer example pod ----------------------------------------------------------------


def _example_pod() -> Manifest:
    pod: Manifest = yaml.safe_load(EXAMPLE_POD.read_text())
    return pod


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_example_pod_valid(version: str, k8s_validate: Callable[[Manifest, str], None]) -> None:
    k8s_validate(_example_pod(), version)


def test_example_pod_gets_only_its_device_unprivileged() -> None:
    pod = _example_pod()
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["ate.dev/kvm"] == 1
    assert c["securityContext"].get("privileged", False) is False
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in spec.get("volumes", []))
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)
    assert "/dev/kvm" in " ".join(c["command"])


def test_example_pod_passes_checkov(tmp_path: Path, checkov: Callable[[Path], dict[str, Any]]) -> None:
    (tmp_path / EXAMPLE_POD.name).write_text(EXAMPLE_POD.read_text())
    results = checkov(tmp_path)["results"]
    assert not results["failed_checks"], [c["check_id"] for c in results["failed_checks"]]
    for c in results["skipped_checks"]:
        assert len(c["check_result"].get("suppress_comment", "")) >= 40, c["check_id"]


def test_chart_readme_shows_the_example_pod() -> None:
    readme = (REPO / "chart" / "README.md").read_text()
    assert "ate.dev/kvm: 1" in readme
    assert re.search(r"docs/examples/kvm-consumer-pod\.yaml", readme)


# --- the micro-VM worker: its pod and the chart's preset ---------------------------------------

WORKER_POD = REPO / "docs" / "examples" / "microvm-worker-pod.yaml"
WORKER_VALUES = REPO / "docs" / "examples" / "microvm-worker-values.yaml"
# QEMU's (run by tests/e2e) and Cloud Hypervisor's (run by hand: docs/microvm-workers.md).
WORKER_PODS = [WORKER_POD, REPO / "docs" / "examples" / "cloud-hypervisor-worker-pod.yaml"]
workers = pytest.mark.parametrize("path", WORKER_PODS, ids=[p.stem for p in WORKER_PODS])


def _worker_pod(path: Path = WORKER_POD) -> Manifest:
    pod: Manifest = yaml.safe_load(path.read_text())
    return pod


@workers
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_worker_pod_valid(path: Path, version: str, k8s_validate: Callable[[Manifest, str], None]) -> None:
    k8s_validate(_worker_pod(path), version)


@workers
def test_worker_pod_has_only_the_minimal_security_context(path: Path) -> None:
    """docs/microvm-workers.md's minimum: the VMM non-root with no capability at all; only the
    init container is root, adding NET_ADMIN alone; the README's request unchanged."""
    spec = _worker_pod(path)["spec"]
    (tap,) = spec["initContainers"]
    (vmm,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert "runAsUser" not in vmm["securityContext"]
    assert vmm["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert tap["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert tap["securityContext"]["runAsUser"] == 0
    for c in (tap, vmm):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"].get("privileged", False) is False
    assert vmm["resources"]["limits"]["ate.dev/kvm"] == 1
    assert tap["resources"]["limits"]["ate.dev/tun"] == vmm["resources"]["limits"]["ate.dev/tun"] == 1
    assert "cpu" not in vmm["resources"]["limits"], "a CPU limit throttles the guest itself"
    assert not any("hostPath" in v for v in spec.get("volumes", []))
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)


def test_the_cloud_hypervisor_worker_makes_its_tap_the_vmms_and_up() -> None:
    """Cloud Hypervisor without CAP_NET_ADMIN attaches only to a tap its uid owns and that is up
    (docs/microvm-workers.md, "Cloud Hypervisor": else TUNSETIFF or SIOCSIFFLAGS fail EPERM)."""
    spec = _worker_pod(WORKER_PODS[1])["spec"]
    (tap,) = spec["initContainers"]
    (vmm,) = spec["containers"]
    script = tap["command"][-1]
    uid = spec["securityContext"]["runAsUser"]
    assert tap["command"][:2] == ["sh", "-ec"]
    assert f"ip tuntap add dev tap0 mode tap user {uid};" in script
    assert script.endswith("ip link set dev tap0 up")
    assert vmm["command"][0] == "cloud-hypervisor"
    assert vmm["command"][vmm["command"].index("--net") + 1] == "tap=tap0"


@workers
def test_worker_pod_passes_checkov(path: Path, tmp_path: Path, checkov: Callable[[Path], dict[str, Any]]) -> None:
    (tmp_path / path.name).write_text(path.read_text())
    results = checkov(tmp_path)["results"]
    assert not results["failed_checks"], [c["check_id"] for c in results["failed_checks"]]
    for c in results["skipped_checks"]:
        assert len(c["check_result"].get("suppress_comment", "")) >= 40, c["check_id"]


def test_the_microvm_preset_renders_the_four_devices(any_helm: Helm) -> None:
    (cm,) = [d for d in by_kind(any_helm.template([WORKER_VALUES]), "ConfigMap") if "config.yaml" in d["data"]]
    resources = yaml.safe_load(cm["data"]["config.yaml"])["resources"]
    assert {r["name"]: r["devices"] for r in resources} == {
        "ate.dev/kvm": ["/dev/kvm"],
        "ate.dev/tun": ["/dev/net/tun"],
        "ate.dev/vhost-net": ["/dev/vhost-net"],
        "ate.dev/vhost-vsock": ["/dev/vhost-vsock"],
    }
    dra = any_helm.template([WORKER_VALUES], sets=["dra.mode=dra"], kube_version="1.37.0")
    classes = {d["metadata"]["name"]: d["spec"].get("extendedResourceName") for d in by_kind(dra, "DeviceClass")}
    assert classes == {
        "kvm.ate.dev": "ate.dev/kvm",
        "tun.ate.dev": "ate.dev/tun",
        "vhost-net.ate.dev": "ate.dev/vhost-net",
        "vhost-vsock.ate.dev": "ate.dev/vhost-vsock",
    }
