"""Renders that cannot know the cluster's release do not guess the newest (chart/README.md,
"Renders without a cluster"), with both real helms.

Offline, helm fills .Capabilities with its own newest release (its client-go's, 1.37 for
v3.22 and v4.3) and an API list of groups and versions only; `--kube-version` changes the
first and nothing else, so a template cannot tell a given release from helm's default. What
a cluster gives helm (install, upgrade, template --validate; Argo CD passes the same with
--api-versions) names kinds too: the chart's sign that the release is the cluster's. tests/e2e
shows the cluster's own answer (test_user_path.py: the 1.37 install rolls with maxSurge 1,
the 1.35 one does not).
"""

from __future__ import annotations

import pytest

from tests.harness.chart import Helm, HelmError, Manifest, by_kind, daemonsets

VAP_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
HELMS_RELEASE = "1.37.0"  # helm v3.22's and v4.3's offline .Capabilities.KubeVersion (client-go v0.37)


def newer_settings(docs: list[Manifest]) -> dict[str, object]:
    """What the chart renders only for a known newer release, and the admission policy."""
    (ds,) = daemonsets(docs)
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    classes = by_kind(docs, "DeviceClass")
    return {
        "maxSurge": ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"],
        "socket suffix": "--socket-suffix=$(K8S_POD_UID)" in args,
        "extendedResourceName": [c["spec"].get("extendedResourceName") for c in classes],
        "admission policy": {d["kind"] for d in docs} >= VAP_KINDS,
    }


def test_a_template_cannot_tell_helms_own_release_from_a_given_one(helm: Helm) -> None:
    """The fact the chart works around: offline, helm's release is its client-go's (1.37 for
    v3.22 and v4.3), so `--kube-version 1.37.0` renders exactly what no --kube-version does."""
    assert helm.template_text(kube_version=HELMS_RELEASE, cluster=False) == helm.template_text()
    assert helm.template_text(kube_version="1.36.0", cluster=False) == helm.template_text()


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
@pytest.mark.parametrize("kube_version", [None, "1.37.0"], ids=["no-version", "kube-version-alone"])
def test_a_render_that_cannot_know_the_release_takes_what_every_release_takes(
    helm: Helm, mode: str, kube_version: str | None
) -> None:
    """`helm template`, with or without --kube-version: no socket suffix and maxSurge 0 (an
    older kubelet would mark the new pod's devices unhealthy), no extendedResourceName (1.35's
    kubelet cannot admit such pods); the admission policy is there (GA on every release DRA
    runs on)."""
    docs = helm.template(sets=[f"dra.mode={mode}"], kube_version=kube_version, cluster=False)
    dra = mode == "dra"
    assert newer_settings(docs) == {
        "maxSurge": 0,
        "socket suffix": False,
        "extendedResourceName": [None] if dra else [],
        "admission policy": dra,
    }


@pytest.mark.parametrize(
    ("kube", "overlap", "named"), [("1.35.4", False, False), ("1.36.3", False, True), ("1.37.2", True, True)]
)  # fmt: skip
def test_where_helm_knows_the_cluster_its_release_decides(helm: Helm, kube: str, overlap: bool, named: bool) -> None:
    """The cluster's version and API list, as helm reads them from a cluster (or Argo CD passes them)."""
    device_plugin = newer_settings(helm.template(kube_version=kube, api_versions=[VAP_API]))
    dra = newer_settings(helm.template(sets=["dra.mode=dra"], kube_version=kube, api_versions=[VAP_API]))
    assert (device_plugin["maxSurge"], device_plugin["socket suffix"]) == (int(overlap), overlap)
    assert dra["extendedResourceName"] == (["ate.dev/kvm"] if named else [None])
    assert (dra["maxSurge"], dra["admission policy"]) == (0, True)
    # The cluster's list without the policy's kind: a cluster that does not serve it.
    assert not newer_settings(helm.template(sets=["dra.mode=dra"], kube_version=kube))["admission policy"]


def test_kube_version_override_turns_the_newer_settings_on_offline(helm: Helm) -> None:
    assert newer_settings(helm.template(sets=["kubeVersionOverride=1.37"]))["socket suffix"] is True
    assert newer_settings(helm.template(sets=["dra.mode=dra", "kubeVersionOverride=v1.36.3"])) == {
        "maxSurge": 0, "socket suffix": False, "extendedResourceName": ["ate.dev/kvm"], "admission policy": True,
    }  # fmt: skip
    assert newer_settings(helm.template(sets=["kubeVersionOverride=1.36"]))["maxSurge"] == 0


def test_an_override_older_than_the_cluster_holds_and_a_newer_one_is_refused(helm: Helm) -> None:
    """Older: a render meant for older clusters too. Newer: what it turns on would break this
    cluster's rollouts."""
    older = newer_settings(helm.template(sets=["kubeVersionOverride=1.36"], kube_version="1.37.2"))
    assert (older["maxSurge"], older["socket suffix"]) == (0, False)
    with pytest.raises(HelmError) as refused:
        helm.template(sets=["kubeVersionOverride=1.37"], kube_version="1.35.4")
    assert 'kubeVersionOverride "1.37" is newer than this cluster (v1.35.4)' in str(refused.value)
    # A provider's build of the same minor release is not newer.
    same = helm.template(sets=["kubeVersionOverride=1.37"], kube_version="1.37.1-eks-4a1b2c3")
    assert newer_settings(same)["socket suffix"] is True


@pytest.mark.parametrize("bad", ["1.28", "latest", "1.37.x", "2"])
def test_the_override_is_a_supported_release(helm: Helm, bad: str) -> None:
    with pytest.raises(HelmError) as refused:
        helm.template(sets=[f"kubeVersionOverride={bad}"])
    assert "kubeVersionOverride" in str(refused.value)
