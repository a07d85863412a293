"""The chart's DRA mode: RBAC with the driver's verbs only, a DeviceClass per resource, the
token and the plugin directories only when DRA is on, flags the daemon accepts, the
admission policy that keeps the driver to its node's slices, egress to the API server, and
the uninstall hook that stops the drivers before their identity goes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.chart import CHART, Helm, HelmError, Manifest, by_kind, daemonsets, is_kvm_prober, one, the_daemons

DRA_KINDS = {"ClusterRole", "ClusterRoleBinding", "DeviceClass"}


def _container(docs: list[Manifest]) -> Any:
    [container] = the_daemons(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


def driver_service_account(docs: list[Manifest]) -> Manifest:
    """The release's ServiceAccount, the uninstall hook's aside."""
    (sa,) = [d for d in by_kind(docs, "ServiceAccount") if "helm.sh/hook" not in d["metadata"].get("annotations", {})]
    return sa


def test_device_plugin_mode_renders_nothing_of_dra(any_helm: Helm) -> None:
    docs = any_helm.template()
    assert not {d["kind"] for d in docs} & DRA_KINDS
    hooks = [
        d["metadata"]["annotations"]["helm.sh/hook"]
        for d in docs
        if "helm.sh/hook" in d["metadata"].get("annotations", {})
    ]
    assert hooks == ["test"], "no uninstall hook (the helm test pod only)"
    pod = the_daemons(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    container = _container(docs)
    assert not [a for a in container["args"] if a.startswith(("--mode", "--dra", "--registry"))]
    assert "NODE_NAME" not in {e["name"] for e in container["env"]}


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_dra_mode_grants_the_driver_its_verbs_only(any_helm: Helm, mode: str) -> None:
    docs = any_helm.template(sets=[f"dra.mode={mode}"])
    role = one(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]  # fmt: skip
    binding = one(docs, "ClusterRoleBinding")
    sa = driver_service_account(docs)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]
    pod = the_daemons(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    container = _container(docs)
    assert {
        "--mode=" + mode,
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--dra-dir=/var/lib/kubelet/plugins/ate.dev",
        "--dra-slots=32",
        "--dra-sharing=capacity",
    } <= set(container["args"])
    [node] = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_a_device_class_per_resource(any_helm: Helm, write_values: Callable[[str], Path]) -> None:
    values = write_values(
        "dra: {mode: dra}\n"
        "deviceConfig:\n  resources:\n"
        "    - {name: ate.dev/kvm, devices: [/dev/kvm]}\n"
        "    - {name: example.com/Net_Tun, devices: [/dev/net/tun]}\n"
    )
    docs = any_helm.template([values], kube_version="1.35.4")
    classes = {c["metadata"]["name"]: c["spec"] for c in by_kind(docs, "DeviceClass")}
    assert classes == {
        "kvm.ate.dev": {"selectors": [{"cel": {"expression":
            'device.driver == "ate.dev" && device.attributes["ate.dev"].resource == "ate.dev/kvm"'}}]},
        "net-tun.example.com": {"selectors": [{"cel": {"expression":
            'device.driver == "ate.dev" && device.attributes["ate.dev"].resource == "example.com/Net_Tun"'}}]},
    }  # fmt: skip
    assert not by_kind(any_helm.template([values], sets=["dra.deviceClasses=false"]), "DeviceClass")


@pytest.mark.parametrize(("kube", "named"), [("1.35.4", False), ("1.36.0", True), ("1.37.2", True)])
def test_from_1_36_each_class_serves_its_extended_resource(any_helm: Helm, kube: str, named: bool) -> None:
    [kvm] = by_kind(any_helm.template(sets=["dra.mode=dra"], kube_version=kube), "DeviceClass")
    assert kvm["spec"].get("extendedResourceName") == ("ate.dev/kvm" if named else None)
    sets = ["dra.mode=dra", "dra.extendedResourceName=false"]
    [off] = by_kind(any_helm.template(sets=sets, kube_version=kube), "DeviceClass")
    assert "extendedResourceName" not in off["spec"]


@pytest.mark.parametrize(
    "bad",
    [
        "dra.mode=kubelet",
        "dra.sharing=shared",
        "dra.extendedResourceName=yes",
        "dra.slots=0",
        "dra.slots=1025",
        "dra.registryDir=relative",
    ],
)
def test_schema_refuses_bad_dra_values(any_helm: Helm, bad: str) -> None:
    out = any_helm.run("template", "t", str(CHART), "--set", bad)
    assert out.returncode != 0
    assert "dra" in out.stderr


def test_the_daemon_accepts_the_dra_flags(any_helm: Helm) -> None:
    args = [a for a in _container(any_helm.template(sets=["dra.mode=both"]))["args"] if a.startswith("--")]
    dra_args = [a for a in args if a.startswith(("--mode", "--dra", "--registry"))]
    code = (
        "import sys; from ate_devplugin.cli import build_parser;"
        "from ate_devplugin.settings import DraSettings, resolve;"
        "a = build_parser().parse_args(['run', *sys.argv[1:]]);"
        "keys = ('mode', 'registry_dir', 'dra_dir', 'dra_slots', 'dra_sharing');"
        "s = resolve({k: getattr(a, k) for k in keys}, {'NODE_NAME': 'n'}); d = s.part(DraSettings);"
        "print(s.values['mode'], d.registration_socket, d.socket, d.dra_slots, d.dra_sharing)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *dra_args], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == [
        "both",
        "/var/lib/kubelet/plugins_registry/ate.dev-reg.sock",
        "/var/lib/kubelet/plugins/ate.dev/dra.sock",
        "32",
        "capacity",
    ]


def test_dra_needs_kubernetes_1_34_where_the_release_is_known(any_helm: Helm) -> None:
    with pytest.raises(HelmError) as cluster:
        any_helm.template(sets=["dra.mode=dra"], kube_version="1.33.0")
    assert "dra.mode=dra needs Kubernetes 1.34 or later (resource.k8s.io/v1); this cluster is v1.33.0" in str(
        cluster.value
    )
    with pytest.raises(HelmError) as override:
        any_helm.template(sets=["dra.mode=dra", "kubeVersionOverride=1.33"])
    assert "; kubeVersionOverride is 1.33" in str(override.value)
    assert any_helm.template(kube_version="1.33.0")
    # Nothing says the release: DRA is the operator's explicit choice, not refused.
    assert any_helm.template(sets=["dra.mode=dra"], kube_version="1.33.0", cluster=False)


# --- the ValidatingAdmissionPolicy: the driver writes its own node's slices only -------------

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def test_slice_policy_where_the_api_server_serves_it_or_helm_cannot_ask(any_helm: Helm) -> None:
    """A cluster's API list without the policy's kind: not rendered. A render without a cluster:
    rendered, as every release DRA runs on (1.34+) serves it (GA since 1.30)."""
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    cluster = any_helm.template(sets=["dra.mode=dra"], kube_version="1.35.4")
    assert not {d["kind"] for d in cluster} & kinds, "not served: not rendered"
    assert {d["kind"] for d in any_helm.template(sets=["dra.mode=dra"])} >= kinds, "offline: rendered"
    served = any_helm.template(sets=["dra.mode=dra"], kube_version="1.35.4", api_versions=[VAP_API])
    assert {d["kind"] for d in served} >= kinds
    assert not {d["kind"] for d in any_helm.template(api_versions=[VAP_API])} & kinds, "device-plugin mode"
    off = any_helm.template(sets=["dra.mode=dra", "dra.sliceAdmissionPolicy=false"], api_versions=[VAP_API])
    assert not {d["kind"] for d in off} & kinds
    assert {d["kind"] for d in any_helm.template(sets=["dra.mode=both"], api_versions=[VAP_API])} >= kinds


def test_slice_policy_names_the_drivers_service_account_and_its_node(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["dra.mode=dra"], api_versions=[VAP_API], namespace="devices")
    policy = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    sa = driver_service_account(docs)["metadata"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "system:serviceaccount:devices:{sa["name"]}"'
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["tokenNode"]
    assert "oldObject" in variables["sliceNode"], "a DELETE has only the old object"
    assert [v["expression"] for v in spec["validations"]] == [
        'variables.tokenNode != ""',
        "variables.tokenNode == variables.sliceNode",
    ]


# --- egress to the API server when egress is restricted ---------------------------------------


def test_restricted_egress_lets_the_driver_reach_the_api_server(any_helm: Helm, write_values: Any) -> None:
    rule = {"to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]}
    values = write_values(f"dra: {{mode: dra}}\nnetworkPolicy: {{restrictEgress: true, apiServerEgress: [{rule}]}}")
    egress = the_daemons(any_helm.template([values]), "NetworkPolicy")["spec"]["egress"]
    assert rule in egress
    # Without the driver no API server egress is added.
    plain = write_values(f"networkPolicy: {{restrictEgress: true, apiServerEgress: [{rule}]}}")
    assert rule not in the_daemons(any_helm.template([plain]), "NetworkPolicy")["spec"]["egress"]


def test_restricted_egress_without_the_address_fails_saying_why(any_helm: Helm) -> None:
    out = any_helm.run(
        "template", "t", str(CHART), "--set", "dra.mode=dra", "--set", "networkPolicy.restrictEgress=true"
    )
    assert out.returncode != 0
    assert "the DRA driver must reach the API server" in out.stderr
    assert "networkPolicy.apiServerEgress" in out.stderr


@pytest.mark.parametrize("pools", [False, True])
def test_uninstall_stops_the_drivers_before_helm_deletes_their_identity(any_helm: Helm, pools: bool) -> None:
    """A pre-delete hook: a Job, under an identity of its own that may only get and delete
    the release's DaemonSets, runs the image's uninstall program on every DaemonSet of the
    release (one per pool); its objects go once it succeeded. Its pod is none of the
    plugin's: no selector of the release picks it."""
    sets = ["dra.mode=dra"]
    if pools:
        sets += ["pools.a.nodeSelector.pool=a", "pools.b.nodeSelector.pool=b"]
    docs = any_helm.template(sets=sets, namespace="devices")
    hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
    assert sorted(d["kind"] for d in hooks) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    for hook in hooks:
        notes = hook["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "pre-delete"
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # The identity exists before the Job runs.
        assert int(notes["helm.sh/hook-weight"]) == (0 if hook["kind"] == "Job" else -10)
    daemon_sets = sorted(d["metadata"]["name"] for d in daemonsets(docs))
    assert len(daemon_sets) == (2 if pools else 1)
    probers = sorted(d["metadata"]["name"] for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d))
    assert len(probers) == len(daemon_sets)  # on by default: stopped first (test_chart_kvm_prober.py)
    (role,) = by_kind(hooks, "Role")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": [*probers, *daemon_sets],
            "verbs": ["get", "delete"],
        }
    ]
    (binding,) = by_kind(hooks, "RoleBinding")
    (sa,) = by_kind(hooks, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "devices"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (job,) = by_kind(hooks, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    [container] = pod["containers"]
    assert {container["image"]} == {
        d["spec"]["template"]["spec"]["containers"][0]["image"] for d in by_kind(docs, "DaemonSet")
    }
    assert container["command"] == ["python3", "-m", "ate_devplugin.dra.uninstall"]
    assert container["args"] == [
        "--namespace=devices",
        "--timeout=60",
        *(f"--first={p}" for p in probers),
        *daemon_sets,
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    labels = job["spec"]["template"]["metadata"]["labels"]
    for selecting in [*by_kind(docs, "DaemonSet"), *by_kind(docs, "NetworkPolicy"), *by_kind(docs, "Service")]:
        spec = selecting["spec"]
        selector = spec.get("selector", {}).get("matchLabels") or spec.get("podSelector", {}).get("matchLabels")
        if selecting["kind"] == "Service":
            selector = spec["selector"]
        assert not selector.items() <= labels.items(), selecting["kind"]


def test_the_uninstall_program_runs_as_the_hook_runs_it() -> None:
    """The hook's command line is one the program takes (its --help), from the package the
    image installs."""
    out = subprocess.run([sys.executable, "-m", "ate_devplugin.dra.uninstall", "--help"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--namespace" in out.stdout
    assert "--timeout" in out.stdout
