"""The KVM prober's DaemonSet (kvmProbe.enabled, the default): what it requests (one unit of
the prober's resource, in every mode), its privileges (uid 0 and nothing else), the socket
directory it shares with the daemon, the identity the daemon accepts, and the daemon's
arguments either way; and the NFD feature file the daemon writes from the probe's verdicts
(nfd.enabled). checkov, validity and helm v3/v4 parity run over chart/ci/kvm-probe*-values.yaml
with the other ci files."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.chart import Helm, HelmError, Manifest, by_kind, daemonsets, is_kvm_prober


def _prober(docs: list[Manifest]) -> Manifest:
    (ds,) = [d for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)]
    return ds


def _daemon_args(docs: list[Manifest]) -> list[str]:
    (ds,) = daemonsets(docs)
    args: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_on_by_default_and_off_the_daemon_judges_by_existence_and_10_232(any_helm: Helm) -> None:
    assert "--kvm-probe=socket" in _daemon_args(any_helm.template())
    docs = any_helm.template(sets=["kvmProbe.enabled=false"])
    assert not [d for d in docs if is_kvm_prober(d) or "kvm-prober" in d["metadata"]["name"]]
    assert "--kvm-probe=off" in _daemon_args(docs)


def test_the_prober_requests_its_resource_as_root_without_capabilities_and_shares_the_socket_directory(
    any_helm: Helm,
) -> None:
    docs = any_helm.template(sets=["kvmProbe.socketDir=/run/ate-x", "kvmProbe.podSecurityContext.runAsGroup=4242"])
    args = _daemon_args(docs)
    assert "--kvm-probe=socket" in args
    assert "--kvm-probe-socket=/run/ate-x/prober.sock" in args
    # The only peer the daemon's socket accepts: the prober's uid and gid.
    assert [a for a in args if a.startswith("--kvm-prober-")] == ["--kvm-prober-uid=0", "--kvm-prober-gid=4242"]
    (daemon,) = daemonsets(docs)
    daemon_volumes = {v["name"]: v for v in daemon["spec"]["template"]["spec"]["volumes"]}
    assert daemon_volumes["kvm-prober"]["hostPath"] == {"path": "/run/ate-x", "type": "DirectoryOrCreate"}

    ds = _prober(docs)
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"] == ["probe", "--kvm-probe-socket=/run/ate-x/prober.sock", "--device=ate.dev/kvm=/dev/kvm"]
    # The prober's resource, advertised on every node: never the resource it judges.
    assert c["resources"]["limits"]["ate.dev/kvm-prober"] == 1
    assert "ate.dev/kvm" not in c["resources"]["limits"]
    assert "resourceClaims" not in pod
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # uid 0 opens a root-owned 0600/0660 node it was granted, and reaches the daemon's 0700 directory.
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (0, 4242)
    assert pod["securityContext"]["runAsNonRoot"] is False
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


@pytest.mark.parametrize("mode", ["device-plugin", "both", "dra"])
def test_in_every_mode_the_prober_takes_a_unit_of_its_resource_and_no_claim(any_helm: Helm, mode: str) -> None:
    """The daemon serves the prober's resource through the device plugin API in every mode:
    in dra mode too it mounts the kubelet's device-plugins directory for it."""
    docs = any_helm.template(sets=[f"dra.mode={mode}"])
    pod = _prober(docs)["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod
    assert pod["containers"][0]["resources"]["limits"]["ate.dev/kvm-prober"] == 1
    assert "claims" not in pod["containers"][0]["resources"]
    assert not [t for t in by_kind(docs, "ResourceClaimTemplate") if "kvm-prober" in t["metadata"]["name"]]
    assert "device-plugins" in _daemon_host_paths(docs)
    assert "--kvm-probe=socket" in _daemon_args(docs)


def test_dra_mode_without_the_prober_mounts_no_device_plugin_directory(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["dra.mode=dra", "kvmProbe.enabled=false"])
    assert "device-plugins" not in _daemon_host_paths(docs)


def test_dra_mode_without_the_charts_device_classes_keeps_the_prober(any_helm: Helm) -> None:
    """The prober claims nothing: a release that leaves the DeviceClasses to another still probes."""
    docs = any_helm.template(sets=["dra.mode=dra", "dra.deviceClasses=false"])
    assert _prober(docs)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["ate.dev/kvm-prober"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        "kvmProbe.socketDir=relative",
        "kvmProbe.podSecurityContext.runAsUser=-1",
        "kvmProbe.podSecurityContext.runAsGroup=null",
        "kvmProbe.podSecurityContext.privileged=true",
        "kvmProbe.unknown=1",
    ],
)
def test_the_schema_refuses(any_helm: Helm, bad: str) -> None:
    with pytest.raises(HelmError):
        any_helm.template(sets=[bad])


def _daemon_host_paths(docs: list[Manifest]) -> dict[str, Any]:
    (ds,) = daemonsets(docs)
    return {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}


def test_no_feature_file_by_default(any_helm: Helm) -> None:
    for sets in ([], ["kvmProbe.enabled=false"]):
        docs = any_helm.template(sets=sets)
        assert not [a for a in _daemon_args(docs) if a.startswith("--nfd-features-dir")]
        assert "nfd-features" not in _daemon_host_paths(docs)


def test_the_feature_file_goes_to_nfds_features_directory(any_helm: Helm) -> None:
    docs = any_helm.template(sets=["nfd.enabled=true"])
    default = "/etc/kubernetes/node-feature-discovery/features.d"
    assert f"--nfd-features-dir={default}" in _daemon_args(docs)
    assert "--nfd-label-ttl=900" in _daemon_args(docs)  # the labels expire 15 min after the daemon is gone
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
        any_helm.template(sets=["nfd.enabled=true", "kvmProbe.enabled=false"])
    assert "nfd.enabled=true needs kvmProbe.enabled=true" in str(failure.value)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("nfd.featuresDir=relative/features.d", "/nfd/featuresDir"),
        ("nfd.featuresDir=/etc/../run/features.d", "nfd.featuresDir"),
        ("nfd.unknown=1", "unknown"),
        ("nfd.labelTtl=10", "/nfd/labelTtl"),
        ("daemon.extraArgs[0]=--nfd-features-dir=/x", "use nfd.enabled and nfd.featuresDir"),
    ],
)
def test_the_feature_file_refuses(any_helm: Helm, bad: str, said: str) -> None:
    with pytest.raises(HelmError) as failure:
        any_helm.template(sets=["kvmProbe.enabled=true", "nfd.enabled=true", bad])
    assert said in str(failure.value)


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_uninstall_stops_the_probers_before_the_drivers(any_helm: Helm, mode: str) -> None:
    """The pre-delete hook deletes each pool's prober DaemonSet first and waits for it (the
    drivers serve the units its pods hold), then the drivers'."""
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


# --- timings, placement and pools (kvmProbe.periodSeconds ... priorityClassName) ---------------


def _pod_spec(ds: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def test_the_probes_timings_and_taint_effect_are_values(any_helm: Helm) -> None:
    args = _daemon_args(any_helm.template(sets=["kvmProbe.periodSeconds=30", "kvmProbe.timeoutSeconds=7"]))
    assert "--kvm-probe-period=30" in args
    assert "--kvm-probe-timeout=7" in args
    assert "--kvm-probe-period=60" in _daemon_args(any_helm.template())
    assert "--dra-taint-effect=NoSchedule" in _daemon_args(any_helm.template(sets=["dra.mode=dra"]))
    assert "--dra-taint-effect=NoExecute" in _daemon_args(
        any_helm.template(sets=["dra.mode=both", "dra.taintEffect=NoExecute"])
    )
    off = _daemon_args(any_helm.template(sets=["kvmProbe.enabled=false"]))
    assert not [a for a in off if a.startswith(("--kvm-probe-period", "--kvm-probe-timeout"))]


def test_by_default_the_prober_runs_where_the_daemon_runs(any_helm: Helm) -> None:
    for sets in ([], ["nodeFeatureRule.enabled=true"]):
        docs = any_helm.template(sets=sets, api_versions=["nfd.k8s-sigs.io/v1alpha1/NodeFeatureRule"])
        (daemon,) = daemonsets(docs)
        prober = _prober(docs)
        for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName"):
            assert _pod_spec(prober).get(key) == _pod_spec(daemon).get(key), key


def test_the_probers_own_placement_narrows_or_replaces_the_daemons(any_helm: Helm) -> None:
    docs = any_helm.template(
        sets=[
            "kvmProbe.nodeSelector.kvm=yes",
            "kvmProbe.nodeRequirements[0].key=node-role.kubernetes.io/control-plane",
            "kvmProbe.nodeRequirements[0].operator=DoesNotExist",
            "kvmProbe.tolerations[0].operator=Exists",
            "kvmProbe.tolerations[0].key=k",
            "kvmProbe.priorityClassName=system-cluster-critical",
        ]
    )
    (daemon,) = daemonsets(docs)
    prober = _pod_spec(_prober(docs))
    assert prober["nodeSelector"] == {**_pod_spec(daemon)["nodeSelector"], "kvm": "yes"}
    (term,) = prober["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (daemon_term,) = _pod_spec(daemon)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    expected = [
        *daemon_term["matchExpressions"],
        {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
    ]
    assert term["matchExpressions"] == expected
    assert prober["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert prober["priorityClassName"] == "system-cluster-critical"
    assert _pod_spec(daemon)["priorityClassName"] == "system-node-critical"


def test_a_pool_sets_the_probe_key_by_key(any_helm: Helm) -> None:
    docs = any_helm.template(
        sets=[
            "kvmProbe.timeoutSeconds=9",
            "pools.vm.nodeSelector.pool=vm",
            "pools.vm.kvmProbe.periodSeconds=15",
            "pools.build.nodeSelector.pool=build",
            "pools.build.kvmProbe.enabled=false",
        ]
    )
    args = {d["metadata"]["labels"]["ate.dev/pool"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in daemonsets(docs)}  # fmt: skip
    assert "--kvm-probe-period=15" in args["vm"]
    assert "--kvm-probe-timeout=9" in args["vm"], "the keys the pool does not set come from the top level"
    assert "--kvm-probe=off" in args["build"]
    probers = [d["metadata"]["labels"]["ate.dev/pool"] for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)]
    assert probers == ["vm"]
    # And the other way round: off at the top level, on in one pool.
    docs = any_helm.template(
        sets=["kvmProbe.enabled=false", "pools.a.nodeSelector.p=a", "pools.a.kvmProbe.enabled=true"]
    )
    assert [d["metadata"]["labels"]["ate.dev/pool"] for d in by_kind(docs, "DaemonSet") if is_kvm_prober(d)] == ["a"]
