"""Bad values are refused before anything is rendered, with a message that names the value:
by values.schema.json (types, enums, patterns, unsafe security settings) or, for rules
across values, by templates/_validate.tpl (for deviceConfig: the generated
templates/_deviceconfig.tpl; tests/chart/test_config_contract.py proves the daemon agrees)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.harness.chart import CHART, Helm, HelmError

# (id, values YAML, fragments the error must contain)
BAD_VALUES: list[tuple[str, str, list[str]]] = [
    ("privileged", "securityContext: {privileged: true}", ["/securityContext/privileged", "false"]),
    (
        "privilege-escalation",
        "securityContext: {allowPrivilegeEscalation: true}",
        ["/securityContext/allowPrivilegeEscalation", "false"],
    ),
    ("writable-root", "securityContext: {readOnlyRootFilesystem: false}", ["/securityContext/readOnlyRootFilesystem"]),
    ("added-capability", "securityContext: {capabilities: {add: [SYS_ADMIN]}}", ["/securityContext/capabilities/add"]),
    (
        "capabilities-not-dropped",
        "securityContext: {capabilities: {drop: [NET_RAW]}}",
        ["/securityContext/capabilities/drop"],
    ),
    (
        "unconfined-seccomp",
        "securityContext: {seccompProfile: {type: Unconfined}}",
        ["/securityContext/seccompProfile/type"],
    ),
    ("surge", "updateStrategy: {rollingUpdate: {maxSurge: 1}}", ["/updateStrategy/rollingUpdate/maxSurge"]),
    ("no-unavailable", "updateStrategy: {rollingUpdate: {maxUnavailable: 0}}", ["maxUnavailable must be at least 1"]),
    ("unknown-top-level-key", "imageTag: latest", ["imageTag", "not allowed"]),
    ("typo-in-section", "serviceMonitor: {enable: true}", ["/serviceMonitor", "enable"]),
    ("short-grace", "terminationGracePeriodSeconds: 2", ["/terminationGracePeriodSeconds"]),
    ("bad-digest", "image: {digest: latest}", ["/image/digest"]),
    ("bad-pull-policy", "image: {pullPolicy: Sometimes}", ["/image/pullPolicy"]),
    ("empty-global-pull-secret", "global: {imagePullSecrets: ['']}", ["/global/imagePullSecrets/0"]),
    ("global-pull-secret-without-name", "global: {imagePullSecrets: [{secret: x}]}", ["/global/imagePullSecrets/0"]),
    ("bad-log-format", "daemon: {logFormat: xml}", ["/daemon/logFormat"]),
    ("bad-log-level", "daemon: {logLevel: loud}", ["/daemon/logLevel"]),
    ("no-resources", "deviceConfig: {resources: []}", ["/deviceConfig/resources"]),
    (
        "resource-without-domain",
        "deviceConfig: {resources: [{name: kvm, devices: [/dev/kvm]}]}",
        ["/deviceConfig/resources/0/name"],
    ),
    (
        "reserved-domain",
        "deviceConfig: {resources: [{name: kubernetes.io/kvm, devices: [/dev/kvm]}]}",
        ["/deviceConfig/resources/0/name"],
    ),
    (
        "duplicate-resource",
        "deviceConfig: {resources: [{name: ate.dev/kvm, devices: [/dev/kvm]},\n"
        "                           {name: ate.dev/kvm, devices: [/dev/tun]}]}",
        ["deviceConfig.resources[1].name: 'ate.dev/kvm' collides with resources[0]"],
    ),
    (
        "device-outside-dev",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/etc/shadow]}]}",
        ["/deviceConfig/resources/0/devices/0"],
    ),
    (
        "device-escape",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/dev/../etc/shadow]}]}",
        ["/deviceConfig/resources/0/devices"],
    ),
    (
        "no-devices",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: []}]}",
        ["/deviceConfig/resources/0/devices"],
    ),
    (
        "zero-units",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/dev/kvm], units: 0}]}",
        ["/deviceConfig/resources/0/units"],
    ),
    (
        "bad-permissions",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/dev/kvm], permissions: rwx}]}",
        ["/deviceConfig/resources/0/permissions"],
    ),
    (
        "unknown-resource-field",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/dev/kvm], count: 3}]}",
        ["/deviceConfig/resources/0", "count"],
    ),
    (
        "relative-mount",
        "deviceConfig: {resources: [{name: ate.dev/x, devices: [/dev/kvm], "
        "mounts: [{container_path: x, host_path: /y}]}]}",
        ["/deviceConfig/resources/0/mounts/0/container_path"],
    ),
    ("relative-plugin-dir", "hostPaths: {devicePlugins: var/lib/kubelet/device-plugins}", ["/hostPaths/devicePlugins"]),
    ("bad-port", "metrics: {port: 70000}", ["/metrics/port"]),
    ("flag-set-by-chart", "daemon: {extraArgs: [--device-root=/dev]}", ["--device-root=/dev", "is set by the chart"]),
    ("tracing-without-endpoint", "tracing: {enabled: true}", ["tracing.endpoint"]),
    ("tracing-bad-endpoint", "tracing: {enabled: true, endpoint: 'collector:4317'}", ["/tracing/endpoint"]),
    ("tracing-bad-sampler", "tracing: {sampler: sometimes}", ["/tracing/sampler"]),
    (
        "servicemonitor-without-service",
        "serviceMonitor: {enabled: true}\nservice: {enabled: false}",
        ["serviceMonitor.enabled=true needs service.enabled=true"],
    ),
    ("bad-interval", "serviceMonitor: {interval: soon}", ["/serviceMonitor/interval"]),
    ("nodeport-service", "service: {type: NodePort}", ["/service/type"]),
    ("bad-label-values", "commonLabels: {team: 3}", ["/commonLabels/team"]),
    # Typos at every level the chart owns: a misspelt key is refused, not ignored.
    ("typo-in-global", "global: {imageRegistery: registry.example.com}", ["invalid propertyName 'imageRegistery'"]),
    ("typo-in-pod-security-context", "podSecurityContext: {runAsUsr: 1}", ["/podSecurityContext", "runAsUsr"]),
    (
        "typo-in-security-context",
        "securityContext: {readOnlyRootFileSystem: true}",
        ["/securityContext", "readOnlyRootFileSystem"],
    ),
    (
        "typo-in-capabilities",
        "securityContext: {capabilities: {drop: [ALL], dorp: [NET_RAW]}}",
        ["/securityContext/capabilities", "dorp"],
    ),
    ("typo-in-seccomp-profile", "securityContext: {seccompProfile: {typ: RuntimeDefault}}", ["seccompProfile", "typ"]),
    ("typo-in-resources", "resources: {limit: {memory: 1Gi}}", ["/resources", "limit"]),
    ("typo-in-kvm-probe", "kvmProbe: {periodSecond: 30}", ["/kvmProbe", "periodSecond"]),
    ("typo-in-kvm-probe-resources", "kvmProbe: {resources: {limit: {cpu: 1}}}", ["/kvmProbe/resources", "limit"]),
    (
        "typo-in-kvm-probe-security-context",
        "kvmProbe: {podSecurityContext: {runAsUser: 0, runAsGroup: 0, runAsNonroot: false}}",
        ["/kvmProbe/podSecurityContext", "runAsNonroot"],
    ),
    (
        "typo-in-test-security-context",
        "test: {podSecurityContext: {fsgroup: 1}}",
        ["/test/podSecurityContext", "fsgroup"],
    ),
    (
        "undefined-alert-disabled",
        "prometheusRule: {disabledAlerts: [AteDevpluginAllocateSlowness]}",
        ["/prometheusRule/disabledAlerts/0", "AteDevpluginAllocateSlow"],
    ),
    ("bad-taint-effect", "dra: {taintEffect: PreferNoSchedule}", ["/dra/taintEffect"]),
    ("zero-probe-timeout", "kvmProbe: {timeoutSeconds: 0}", ["/kvmProbe/timeoutSeconds"]),
    ("pool-sets-probe-socket", "pools: {a: {kvmProbe: {socketDir: /x}}}", ["/pools/a/kvmProbe", "socketDir"]),
]


@pytest.mark.parametrize(("values", "fragments"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_values_rejected(
    helm: Helm, write_values: Callable[[str], Path], values: str, fragments: list[str]
) -> None:
    with pytest.raises(HelmError) as failure:
        helm.template([write_values(values)])
    message = str(failure.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in helm's error:\n{message}"
    # One clear line per problem, not a template stack dump.
    assert "Use --debug" not in message or "execution error" in message


TYPOS = [c for c in BAD_VALUES if c[0].startswith("typo-") or c[0] == "undefined-alert-disabled"]


@pytest.mark.parametrize(("values", "fragments"), [c[1:] for c in TYPOS], ids=[c[0] for c in TYPOS])
def test_typos_fail_lint(helm: Helm, write_values: Callable[[str], Path], values: str, fragments: list[str]) -> None:
    """`helm lint` refuses them as `helm template` and `install` do."""
    out = helm.run("lint", str(CHART), "--values", str(write_values(values)))
    assert out.returncode != 0, out.stdout
    for fragment in fragments:
        assert fragment in out.stdout + out.stderr


@pytest.mark.parametrize(
    "values",
    [
        "global: {storageClass: fast, imageRegistry: registry.example.com}",  # a parent chart's own globals
        "pools: {nokvm: {nodeSelector: {pool: nokvm}, kvmProbe: {enabled: false}}}",
        "prometheusRule: {disabledAlerts: [AteDevpluginAllocateSlow]}",
        "podSecurityContext: {runAsUser: 0, runAsGroup: 0, runAsNonRoot: false, fsGroup: 0, supplementalGroups: [1]}",
    ],
)
def test_what_the_schema_still_accepts(helm: Helm, write_values: Callable[[str], Path], values: str) -> None:
    assert helm.template([write_values(values)])


def test_schema_is_draft7_and_accepts_defaults_and_ci_files() -> None:
    """The same verdicts from an independent validator (python-jsonschema) as from helm's."""
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not list(validator.iter_errors(defaults))
    for case_id, text, _ in BAD_VALUES:
        if case_id in {
            "no-unavailable",
            "duplicate-resource",
            "flag-set-by-chart",
            "tracing-without-endpoint",
            "servicemonitor-without-service",
        }:
            continue  # checked by templates/_validate.tpl, not by the schema
        merged = _merge(defaults, yaml.safe_load(text))
        assert list(validator.iter_errors(merged)), f"schema accepts bad values {case_id}"


def _merge(base: object, override: object) -> object:
    """helm's merge of a values file over the defaults: maps merge, everything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return override
