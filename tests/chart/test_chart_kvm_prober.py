"""The KVM prober's DaemonSet (kvmProbe.enabled): what it requests, its privileges (none),
the socket directory it shares with the daemon, and the daemon's arguments either way; and
the NFD feature file the daemon writes from the probe's verdicts (nfd.enabled). checkov,
validity and helm v3/v4 parity run over chart/ci/kvm-probe-values.yaml (both on) with the
other ci files."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.chart import Helm, HelmError, Manifest, by_kind, daemonsets, is_kvm_prober


def _prober(docs: list[Manifest]) -> Manifest:
    (ds,) = [d for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)]
    return ds


def _prober_templates(docs: list[Manifest]) -> list[Manifest]:
    return [
        t
        for t in by_kind(docs, "ResourceClaimTemplate")
        if t["metadata"]["labels"].get("app.kubernetes.io/component") == "kvm-prober"
    ]


def _daemon_args(docs: list[Manifest]) -> list[str]:
    (ds,) = daemonsets(docs)
    args: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_off_by_default_the_daemon_judges_by_existence(any_helm: Helm) -> None:
    docs = any_helm.template()
    assert not [d for d in docs if is_kvm_prober(d) or "kvm-prober" in d["metadata"]["name"]]
    assert "--kvm-probe=off" in _daemon_args(docs)


def test_the_prober_requests_a_unit_unprivileged_and_shares_the_socket_directory(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["kvmProbe.enabled=true", "kvmProbe.socketDir=/run/ate-x"])
    args = _daemon_args(docs)
    assert "--kvm-probe=socket" in args
    assert "--kvm-probe-socket=/run/ate-x/prober.sock" in args
    (daemon,) = daemonsets(docs)
    daemon_volumes = {v["name"]: v for v in daemon["spec"]["template"]["spec"]["volumes"]}
    assert daemon_volumes["kvm-prober"]["hostPath"] == {"path": "/run/ate-x", "type": "DirectoryOrCreate"}

    ds = _prober(docs)
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"] == ["probe", "--kvm-probe-socket=/run/ate-x/prober.sock", "--device=ate.dev/kvm=/dev/kvm"]
    assert c["resources"]["limits"]["ate.dev/kvm"] == 1
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert (pod["hostNetwork"], pod["hostPID"], pod["hostIPC"]) == (False, False, False)
    assert "ports" not in c
    # Its only host path is the socket directory, read-only: no /dev, no kubelet directory.
    assert [(v["name"], v["hostPath"]["path"]) for v in pod["volumes"]] == [("kvm-prober", "/run/ate-x")]
    assert c["volumeMounts"] == [{"name": "kvm-prober", "mountPath": "/run/ate-x", "readOnly": True}]
    # Its own name label: the daemon's DaemonSet, Service and NetworkPolicy never select it.
    labels = ds["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/name"] == "ate-devplugin-kvm-prober"
    for service in by_kind(docs, "Service"):
        assert service["spec"]["selector"]["app.kubernetes.io/name"] == "ate-devplugin"
    (policy,) = [p for p in by_kind(docs, "NetworkPolicy") if p["spec"]["podSelector"]["matchLabels"] == labels]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in policy["spec"]


def test_each_pool_gets_its_prober(any_helm: Helm) -> None:
    docs = any_helm.template(
        sets=["kvmProbe.enabled=true", "pools.big.nodeSelector.size=big", "pools.small.nodeSelector.size=small"]
    )
    probers = [d for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)]
    selectors = sorted(d["spec"]["template"]["spec"]["nodeSelector"]["size"] for d in probers)
    assert selectors == ["big", "small"]
    assert len({d["metadata"]["name"] for d in probers}) == 2


TAINT_TOLERATION = {"key": "ate.dev/kvm-unhealthy", "operator": "Exists"}


def test_in_dra_mode_the_prober_claims_a_device_tolerating_the_taint(any_helm: Helm) -> None:
    """No unit in dra mode: a ResourceClaimTemplate of the resource's DeviceClass whose request
    tolerates the driver's taint (no effect: every effect), so that a prober pod made while
    the probe fails is still allocated the device it must report on."""
    docs = any_helm.template(sets=["kvmProbe.enabled=true", "dra.mode=dra", "kvmProbe.socketDir=/run/ate-x"])
    assert "--kvm-probe=socket" in _daemon_args(docs)
    ds = _prober(docs)
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (ref,) = pod["resourceClaims"]
    (template,) = _prober_templates(docs)
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert ref == {"name": "kvm", "resourceClaimTemplateName": template["metadata"]["name"]}
    assert template["metadata"]["namespace"] == ds["metadata"]["namespace"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "kvm",
        "exactly": {"deviceClassName": "kvm.ate.dev", "tolerations": [TAINT_TOLERATION]},
    }
    (device_class,) = by_kind(docs, "DeviceClass")
    assert device_class["metadata"]["name"] == "kvm.ate.dev"
    assert c["resources"]["claims"] == [{"name": "kvm"}]
    assert "ate.dev/kvm" not in c["resources"]["limits"]
    assert c["args"] == ["probe", "--kvm-probe-socket=/run/ate-x/prober.sock", "--device=ate.dev/kvm=/dev/kvm"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_each_pool_gets_its_claim_template(any_helm: Helm) -> None:
    docs = any_helm.template(
        sets=[
            "kvmProbe.enabled=true",
            "dra.mode=dra",
            "pools.big.nodeSelector.size=big",
            "pools.small.nodeSelector.size=small",
        ]
    )
    probers = [d for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)]
    templates = {t["metadata"]["name"] for t in _prober_templates(docs)}
    claimed = {d["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for d in probers}
    assert len(probers) == 2
    assert claimed == templates


@pytest.mark.parametrize("mode", ["device-plugin", "both"])
def test_outside_dra_mode_the_prober_takes_a_unit_and_no_claim(any_helm: Helm, mode: str) -> None:
    docs = any_helm.template(sets=["kvmProbe.enabled=true", f"dra.mode={mode}"])
    pod = _prober(docs)["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod
    assert pod["containers"][0]["resources"]["limits"]["ate.dev/kvm"] == 1
    assert "claims" not in pod["containers"][0]["resources"]
    assert not _prober_templates(docs)


def test_dra_mode_without_the_charts_device_classes_refuses_the_prober(any_helm: Helm) -> None:
    with pytest.raises(HelmError) as failure:
        any_helm.template(sets=["kvmProbe.enabled=true", "dra.mode=dra", "dra.deviceClasses=false"])
    assert "kvmProbe.enabled=true with dra.mode=dra needs dra.deviceClasses=true" in str(failure.value)


@pytest.mark.parametrize(
    "bad",
    ["kvmProbe.socketDir=relative", "kvmProbe.podSecurityContext.runAsUser=0", "kvmProbe.unknown=1"],
)
def test_the_schema_refuses(any_helm: Helm, bad: str) -> None:
    with pytest.raises(HelmError):
        any_helm.template(sets=["kvmProbe.enabled=true", bad])


def _daemon_host_paths(docs: list[Manifest]) -> dict[str, Any]:
    (ds,) = daemonsets(docs)
    return {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}


def test_no_feature_file_by_default(any_helm: Helm) -> None:
    for sets in ([], ["kvmProbe.enabled=true"]):
        docs = any_helm.template(sets=sets)
        assert not [a for a in _daemon_args(docs) if a.startswith("--nfd-features-dir")]
        assert "nfd-features" not in _daemon_host_paths(docs)


def test_the_feature_file_goes_to_nfds_features_directory(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["kvmProbe.enabled=true", "nfd.enabled=true"])
    default = "/etc/kubernetes/node-feature-discovery/features.d"
    assert f"--nfd-features-dir={default}" in _daemon_args(docs)
    assert _daemon_host_paths(docs)["nfd-features"] == {"path": default, "type": "DirectoryOrCreate"}
    (ds,) = daemonsets(docs)
    mounts = {m["name"]: m for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["nfd-features"] == {"name": "nfd-features", "mountPath": default}  # read-write
    # Only the daemon writes it: the prober mounts nothing of NFD's.
    prober_volumes = _prober(docs)["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in prober_volumes] == ["kvm-prober"]

    docs = any_helm.template(sets=["kvmProbe.enabled=true", "nfd.enabled=true", "nfd.featuresDir=/run/nfd/features.d"])
    assert "--nfd-features-dir=/run/nfd/features.d" in _daemon_args(docs)
    assert _daemon_host_paths(docs)["nfd-features"]["path"] == "/run/nfd/features.d"


def test_the_feature_file_needs_the_prober(any_helm: Helm) -> None:
    with pytest.raises(HelmError) as failure:
        any_helm.template(sets=["nfd.enabled=true"])
    assert "nfd.enabled=true needs kvmProbe.enabled=true" in str(failure.value)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("nfd.featuresDir=relative/features.d", "/nfd/featuresDir"),
        ("nfd.featuresDir=/etc/../run/features.d", "nfd.featuresDir"),
        ("nfd.unknown=1", "unknown"),
        ("daemon.extraArgs[0]=--nfd-features-dir=/x", "use nfd.enabled and nfd.featuresDir"),
    ],
)
def test_the_feature_file_refuses(any_helm: Helm, bad: str, said: str) -> None:
    with pytest.raises(HelmError) as failure:
        any_helm.template(sets=["kvmProbe.enabled=true", "nfd.enabled=true", bad])
    assert said in str(failure.value)


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_uninstall_stops_the_probers_before_the_drivers(any_helm: Helm, mode: str) -> None:
    """The pre-delete hook deletes each pool's prober DaemonSet first and waits for it (in dra
    mode a prober pod's claim is unprepared by the running driver), then the drivers'."""
    sets = ["kvmProbe.enabled=true", f"dra.mode={mode}", "pools.a.nodeSelector.pool=a", "pools.b.nodeSelector.pool=b"]
    docs = any_helm.template(sets=sets)
    probers = sorted(d["metadata"]["name"] for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d))
    drivers = sorted(d["metadata"]["name"] for d in daemonsets(docs))
    assert len(probers) == len(drivers) == 2
    hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
    (job,) = by_kind(hooks, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][2:] == [*(f"--first={p}" for p in probers), *drivers]
    (role,) = by_kind(hooks, "Role")
    assert sorted(role["rules"][0]["resourceNames"]) == sorted(probers + drivers)
