"""The chart's `helm test` pod (templates/tests/verify.yaml): what it asks for in each mode,
that it runs `ate-devplugin verify` as the real command line parses it, its security (UID 0
with no capability: tests/kvm shows it opening root-owned 0600 and 0660 nodes), one pod per
listed node, and the values it refuses. tests/e2e runs it on real clusters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ate_devplugin.cli import build_parser
from tests.harness.chart import CHART, Helm, HelmError, Manifest, by_kind, daemonsets, supported_k8s_versions

K8S_VERSIONS = supported_k8s_versions()
PRESET = CHART.parent / "docs" / "examples" / "microvm-worker-values.yaml"


def claim_templates(docs: list[Manifest]) -> list[Manifest]:
    """The test's ResourceClaimTemplate: an object of the release, no hook (helm test --logs
    asks for a pod's log under the name of every test hook, whatever its kind)."""
    found = by_kind(docs, "ResourceClaimTemplate")
    assert all("helm.sh/hook" not in d["metadata"].get("annotations", {}) for d in found)
    return found


def hooks(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in by_kind(docs, kind) if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def verify_pods(docs: list[Manifest]) -> list[Manifest]:
    return hooks(docs, "Pod")


def test_device_plugin_mode_asks_for_one_unit_and_runs_verify_as_root_without_capabilities(any_helm: Helm) -> None:
    docs = any_helm.template(kube_version="1.37.0")
    (pod,) = verify_pods(docs)
    assert pod["metadata"]["name"] == "ate-ate-devplugin-verify"  # the tests' release is "ate"
    notes = pod["metadata"]["annotations"]
    # Kept after the run, for `helm test --logs` and kubectl logs; the next run replaces it.
    assert (notes["helm.sh/hook"], notes["helm.sh/hook-delete-policy"]) == ("test", "before-hook-creation")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["ate.dev/kvm"] == 1
    assert "claims" not in container["resources"]
    assert "resourceClaims" not in spec
    assert not claim_templates(docs)
    assert container["command"] == ["ate-devplugin"]
    assert container["args"] == ["verify", "--device=/dev/kvm", "--timeout=10"]
    (daemon_set,) = daemonsets(docs)
    assert container["image"] == daemon_set["spec"]["template"]["spec"]["containers"][0]["image"]
    # UID 0 and nothing else: no capability, nothing writable, no token, no host namespace or path.
    assert spec["securityContext"] == {
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert "volumes" not in spec
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_the_pods_arguments_are_what_the_command_line_parses(any_helm: Helm) -> None:
    for sets in ([], ["test.timeout=3", "test.device=/dev/kvm-0"]):
        (pod,) = verify_pods(any_helm.template(sets=sets))
        (container,) = pod["spec"]["containers"]
        args = build_parser().parse_args(container["args"])
        assert args.command == "verify"
        assert (args.device, float(args.timeout)) == (("/dev/kvm", 10.0) if not sets else ("/dev/kvm-0", 3.0))


def test_dra_mode_asks_with_a_claim_of_the_charts_device_class(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["dra.mode=dra"], kube_version="1.35.0")
    (template,) = claim_templates(docs)
    (pod,) = verify_pods(docs)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    classes = {d["metadata"]["name"] for d in by_kind(docs, "DeviceClass")}
    assert request["exactly"]["deviceClassName"] == "kvm.ate.dev" in classes
    assert pod["spec"]["resourceClaims"] == [{"name": "kvm", "resourceClaimTemplateName": template["metadata"]["name"]}]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": "kvm"}]
    assert "ate.dev/kvm" not in container["resources"]["limits"]


def test_both_mode_asks_for_the_extended_resource(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["dra.mode=both"], kube_version="1.37.0")
    assert not claim_templates(docs)
    (pod,) = verify_pods(docs)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["ate.dev/kvm"] == 1


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_one_pod_per_listed_node_pinned_by_its_hostname_label(any_helm: Helm, mode: str) -> None:
    """A nodeSelector, not nodeName: the scheduler still places each pod, so in dra mode it
    allocates its claim (a pod bound by nodeName skips the scheduler, and its claim stays
    unallocated)."""
    nodes = ["e2e-node", "e2e-node-2", "Worker-7.Example.com"]
    docs = any_helm.template(sets=[f"dra.mode={mode}", "test.nodes={" + ",".join(nodes) + "}"], kube_version="1.37.0")
    pods = verify_pods(docs)
    assert [p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in pods] == nodes
    names = [p["metadata"]["name"] for p in pods]
    assert len(set(names)) == len(nodes)
    assert all(len(n) <= 63 and n.startswith("ate-ate-devplugin-verify-") for n in names), names
    assert names[2].startswith("ate-ate-devplugin-verify-worker-7-example-com-")
    assert all("nodeName" not in p["spec"] for p in pods)
    assert len(claim_templates(docs)) == (1 if mode == "dra" else 0)  # a claim per pod from one


def test_the_microvm_preset_checks_its_kvm_resource(any_helm: Helm) -> None:
    (pod,) = verify_pods(any_helm.template([PRESET]))
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"ate.dev/kvm": 1, "cpu": "500m", "memory": "128Mi"}
    assert "--device=/dev/kvm" in container["args"]


def test_the_kvm_resource_is_found_by_its_device_and_a_config_without_one_has_no_test(
    any_helm: Helm, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "deviceConfig: {resources: [{name: ate.dev/fuse, devices: [/dev/fuse]}, {name: vm.example.com/kvm, "
        "devices: [/dev/kvm]}]}\n"
    )
    (pod,) = verify_pods(any_helm.template([values]))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["vm.example.com/kvm"] == 1
    other = tmp_path / "fuse-only.yaml"  # a file of its own: renders are cached by their arguments
    other.write_text("deviceConfig: {resources: [{name: ate.dev/fuse, devices: /dev/fuse}]}\n")
    assert not verify_pods(any_helm.template([other]))


def test_disabled_renders_no_test(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["test.enabled=false", "dra.mode=dra"])
    assert not [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["test.resource=ate.dev/fuse"],
            'test.resource "ate.dev/fuse" is not one of deviceConfig.resources (ate.dev/kvm)',
        ),
        (
            [
                "deviceConfig.resources[0].name=ate.dev/fuse",
                "deviceConfig.resources[0].devices={/dev/fuse}",
                "test.resource=ate.dev/kvm",
            ],
            'test.resource "ate.dev/kvm" is not one of deviceConfig.resources (ate.dev/fuse)',
        ),
        (["test.timeout=0"], "/test/timeout"),
        (["test.timeout=301"], "/test/timeout"),
        # The kubelet would refuse to start it: root and runAsNonRoot.
        (["test.podSecurityContext.runAsNonRoot=true"], "/test/podSecurityContext/runAsNonRoot"),
        (["test.podSecurityContext.seccompProfile.type=Unconfined"], "/test/podSecurityContext/seccompProfile"),
        (["test.device=/dev/kvm*"], "/test/device"),
        (["test.nodes={a b}"], "/test/nodes"),
    ],
)
def test_bad_test_values_are_refused_naming_the_value(any_helm: Helm, sets: list[str], message: str) -> None:
    with pytest.raises(HelmError) as refused:
        any_helm.template(sets=sets, kube_version="1.37.0")
    assert message in str(refused.value)


def test_a_glob_needs_the_device_named(any_helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("deviceConfig: {resources: [{name: ate.dev/kvm, devices: ['/dev/kvm*']}]}\n")
    with pytest.raises(HelmError) as refused:
        any_helm.template([values], sets=["test.resource=ate.dev/kvm"])
    assert 'test.device: ate.dev/kvm\'s first device "/dev/kvm*" is a glob' in str(refused.value)
    (pod,) = verify_pods(any_helm.template([values], sets=["test.resource=ate.dev/kvm", "test.device=/dev/kvm"]))
    assert "--device=/dev/kvm" in pod["spec"]["containers"][0]["args"]


def test_dra_mode_with_the_operators_own_device_classes_renders_no_test(any_helm: Helm) -> None:
    """The chart knows no class to claim from then (chart/README.md, "helm test")."""
    docs = any_helm.template(sets=["dra.mode=dra", "dra.deviceClasses=false"], kube_version="1.37.0")
    assert not [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def test_a_config_map_of_ones_own_uses_the_device_named(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["deviceConfig.existingConfigMap=devices", "test.device=/dev/kvm"])
    (pod,) = verify_pods(docs)
    assert "--device=/dev/kvm" in pod["spec"]["containers"][0]["args"]


# dra.mode needs 1.34 (resource.k8s.io/v1): the chart refuses it before.
VALIDATED = [("device-plugin", v) for v in K8S_VERSIONS] + [
    ("dra", v) for v in K8S_VERSIONS if int(v.split(".")[1]) >= 34
]


@pytest.mark.parametrize(("mode", "version"), VALIDATED)
def test_the_test_objects_are_valid(
    any_helm: Helm, version: str, mode: str, k8s_validate: Callable[[Manifest, str], None]
) -> None:
    docs = any_helm.template(sets=[f"dra.mode={mode}", "test.nodes={a,b}"], kube_version=version)
    found = [*verify_pods(docs), *claim_templates(docs)]
    assert found
    for manifest in found:
        k8s_validate(manifest, version)


def test_a_non_root_user_of_ones_own_is_kept_and_checkov_skips_only_for_root(any_helm: Helm) -> None:
    """test.podSecurityContext checks what a workload's user can open: kept as given, and the
    root findings' skips go with UID 0."""
    root = verify_pods(any_helm.template())[0]["metadata"]["annotations"]
    assert {v.split("=")[0] for k, v in root.items() if k.startswith("checkov.io/")} >= {"CKV_K8S_23", "CKV_K8S_40"}
    sets = ["test.podSecurityContext.runAsUser=10001", "test.podSecurityContext.runAsNonRoot=true",
            "test.podSecurityContext.supplementalGroups={36}"]  # fmt: skip
    (pod,) = verify_pods(any_helm.template(sets=sets))
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert pod["spec"]["securityContext"]["supplementalGroups"] == [36]
    skipped = {v.split("=")[0] for k, v in pod["metadata"]["annotations"].items() if k.startswith("checkov.io/")}
    assert not skipped & {"CKV_K8S_23", "CKV_K8S_40"}


def test_values_files_render_their_test(any_helm: Helm, ci_values: Path) -> None:
    """Every ci/ file: a test pod (or none where disabled) with no capability."""
    docs = any_helm.template([ci_values])
    for pod in verify_pods(docs):
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["args"][0] == "verify"
