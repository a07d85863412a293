"""The config contract: the chart renders a deviceConfig IF AND ONLY IF the daemon accepts it.

The daemon's model (app/ate_devplugin/config.py) is the only definition of the rules; the
chart's side (values.schema.json's deviceConfig, templates/_deviceconfig.tpl) is generated
from it by tools/gen-config-schema.py. Here real helm (v3 and v4) judges a generated
corpus of valid, invalid and boundary configs, the daemon's own validation judges the same
data, and the verdicts must agree; what helm renders must read back, through the daemon's
file decoder, as the very resources the daemon accepted.

The socket path rule depends on what the chart passes the daemon, which differs by release
(from 1.37 the sockets' names carry the pod's UID): for every release the templates treat
differently and every mode, the daemon starts on the longest name the chart renders and
refuses the next one, as the chart does.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from ate_devplugin import config
from ate_devplugin.cli import build_parser
from ate_devplugin.config import ConfigError, check_across, decode_resources, resources_from_document
from ate_devplugin.settings import OPTIONS, RuntimeSettings, resolve
from tests.harness.chart import CHART, CLUSTER_API, NAMESPACE, RELEASE, REPO, Helm, by_kind, daemonsets

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # the chart's default hostPaths.devicePlugins
# The corpus is rendered for the oldest release, where the chart passes no socket suffix;
# the release-dependent rule is judged on every release below (kube_versions()).
CORPUS_RELEASE = "1.29.0"
SCHEMA_ERROR = "values don't meet the specifications of the schema"
GOOD = {"name": "ate.dev/kvm", "devices": ["/dev/kvm"]}


def _domain(chars: int) -> str:
    """A valid DNS subdomain of exactly ``chars`` characters."""
    labels, left = [], chars
    while left > 0:
        take = min(63, left if left <= 63 else left - 2)  # never leave a label of 0 or a dangling dot
        labels.append("d" * take)
        left -= take + 1
    return ".".join(labels)


def _name_of_length(chars: int) -> str:
    return "ate.dev/" + "n" * (chars - len("ate.dev/"))


def field_values() -> dict[str, list[Any]]:
    """Per field: valid, invalid and boundary values."""
    long_part = max(config.max_units(n) for n in (3, 63))
    return {
        "name": [
            "ate.dev/kvm",
            "a/b",
            "ate.dev/x_y.z-1",
            "requests.ate.dev/x",
            "kubernetes.io/x",
            "x.kubernetes.io/y",
            "ate.dev/" + "k" * 63,
            "ate.dev/" + "k" * 64,
            _domain(config.MAX_DOMAIN_CHARS) + "/x",
            _domain(config.MAX_DOMAIN_CHARS + 1) + "/x",
            _domain(254) + "/x",
            _name_of_length(66),  # the longest whose socket path fits the default plugin dir
            _name_of_length(67),
            "ATE.dev/x",
            "ate.dev/-x",
            "ate.dev/x-",
            "ate.dev/a/b",
            "ate.dev",
            "/x",
            "ate.dev/",
            "ate.dev/kvm\n",
            "ate..dev/x",
            "-ate.dev/x",
            "até.dev/x",
            "",
            5,
            None,
        ],
        "devices": [
            ["/dev/kvm"],
            ["/dev/net/tun", "/dev/vfio/*", "/dev/dri/renderD[0-9]*"],
            [],
            ["/dev/kvm", "/dev/kvm"],
            ["/dev//kvm"],
            ["/dev/./kvm"],
            ["/dev/../etc/shadow"],
            ["/dev/..x", "/dev/.x", "/dev/x..", "/dev/..."],
            ["/dev"],
            ["/dev/"],
            ["/dev/kvm/"],
            ["//dev/kvm"],
            ["dev/kvm"],
            ["/etc/passwd"],
            ["/dev/kvm\n"],
            ["/dev/k\tvm"],
            ["/dev/k\x00"],
            ["/dev/é"],
            ["/dev/" + "p" * (config.MAX_PATH_CHARS - 5)],
            ["/dev/" + "p" * (config.MAX_PATH_CHARS - 4)],
            [f"/dev/d{i}" for i in range(config.MAX_DEVICES)],
            [f"/dev/d{i}" for i in range(config.MAX_DEVICES + 1)],
            [3],
            "/dev/kvm",
            None,
        ],
        "units": [1, 0, -1, 4096, 4096.0, 1.5, config.max_units(3), config.max_units(3) + 1, long_part, 2**63, "8"],
        "permissions": ["r", "rw", "wr", "rwm", "mwr", "m", "rr", "rwmr", "rwx", "", "RW", 5],
        "mounts": [
            [],
            [{"container_path": "/etc/x", "host_path": "/var/x"}],
            [{"container_path": "/a", "host_path": "/b", "read_only": False}],
            [{"container_path": "/a", "host_path": "/b", "read_only": "yes"}],
            [{"container_path": "/a"}],
            [{"container_path": "a", "host_path": "/b"}],
            [{"container_path": "/a/../b", "host_path": "/b"}],
            [{"container_path": "/a/", "host_path": "/b"}],
            [{"container_path": "/", "host_path": "/b"}],
            [{"container_path": "/a", "host_path": "/b\n"}],
            [{"container_path": "/a", "host_path": "/b", "mode": "ro"}],
            [{"container_path": f"/c{i}", "host_path": "/h"} for i in range(config.MAX_MOUNTS)],
            [{"container_path": f"/c{i}", "host_path": "/h"} for i in range(config.MAX_MOUNTS + 1)],
            {"container_path": "/a", "host_path": "/b"},
            ["/a:/b"],
        ],
        "env": [
            {},
            {"A": "x", "_B1": "", "c": "multi\nline"},
            {"A": 1, "B": 1.5},
            {"A": True},
            {"A": None},
            {"A": ["x"]},
            {"1A": "x"},
            {"A-B": "x"},
            {"A B": "x"},
            {"A": "x" * config.MAX_ENV_VALUE_CHARS},
            {"A": "x" * (config.MAX_ENV_VALUE_CHARS + 1)},
            {"A": "a\x00b"},
            {"E" * config.MAX_ENV_NAME_CHARS: "x"},
            {"E" * (config.MAX_ENV_NAME_CHARS + 1): "x"},
            {f"V{i}": "x" for i in range(config.MAX_ENV)},
            {f"V{i}": "x" for i in range(config.MAX_ENV + 1)},
            ["A=x"],
        ],
        "allocate": ["devices", "cdi", "both", "CDI", "", "cdi\n", 1, None],
        "health": ["kvm", "exists", "KVM", "", 1, None],
        "preferred_allocation": [True, False, "true", 1, None],
        "cdi": [
            {},
            {"file_mode": "0666", "uid": 10001, "gid": 0},
            {"file_mode": "640"},
            {"file_mode": "0999"},
            {"file_mode": "04755"},
            {"file_mode": 438},
            {"uid": config.MAX_ID, "gid": 1.0},
            {"uid": config.MAX_ID + 1},
            {"gid": -1},
            {"uid": "1"},
            {"mode": "0666"},
            ["0666"],
        ],
        "restore_profiles": [
            {},
            {"q3": {}},
            {
                "q3": {
                    "features": ["avx2", "cpuid_7_0_ebx_22", "3dnow"],
                    "vendor": "GenuineIntel",
                    "kvm_implementations": ["vmx", "pvm"],
                    "tsc": {"khz": 2100000, "tolerance_ppm": 0},
                }
            },
            {"q3": {"tsc": {"scaling": "require"}}, "q4_2026": {"features": []}, "2026": {}, "on": {}, "1e3": {}},
            {"n" * config.MAX_PROFILE_NAME_CHARS: {}},
            {"n" * (config.MAX_PROFILE_NAME_CHARS + 1): {}},
            {f"p{i}": {} for i in range(config.MAX_RESTORE_PROFILES)},
            {f"p{i}": {} for i in range(config.MAX_RESTORE_PROFILES + 1)},
            {"restore-q3": {}},
            {"Q3": {}},
            {"q3_": {}},
            {"q3": None},
            {"q3": {"features": ["avx_2"]}},
            {"q3": {"features": ["cpuid_b_0_edx_1"]}},
            {"q3": {"features": ["cpuid_7_0_ebx_32"]}},
            {"q3": {"features": ["avx2", "avx2"]}},
            {"q3": {"features": "avx2"}},
            {"q3": {"vendor": "Intel"}},
            {"q3": {"kvm_implementations": ["vmx", "vmx"]}},
            {"q3": {"tsc": {"khz": 0}}},
            {"q3": {"tsc": {"khz": 2**32}}},
            {"q3": {"tsc": {"tolerance_ppm": 1000001}}},
            {"q3": {"tsc": {"scaling": "always"}}},
            {"q3": {"cores": 2}},
            {
                "q3": {
                    "cpu_template": {
                        "msr_modifiers": [],
                        "cpuid_modifiers": [
                            {
                                "leaf": "0x7",
                                "subleaf": "0b0",
                                "flags": 1,
                                "modifiers": [
                                    {"register": "ebx", "bitmap": "0b" + "1" * 32},
                                    {"register": "ecx", "bitmap": "x_0_1"},
                                ],
                            }
                        ],
                    }
                }
            },
            {
                "q3": {
                    "cpu_template": {
                        "cpuid_modifiers": [
                            {
                                "leaf": "0x7",
                                "subleaf": "0x0",
                                "flags": 1,
                                "modifiers": [{"register": "ebx", "bitmap": "0b" + "1" * 33}],
                            }
                        ]
                    }
                }
            },
            {
                "q3": {
                    "cpu_template": {"cpuid_modifiers": [{"leaf": "7", "subleaf": "0x0", "flags": 1, "modifiers": []}]}
                }
            },
            {
                "q3": {
                    "cpu_template": {
                        "cpuid_modifiers": [{"leaf": "0x1ffffffff", "subleaf": "0x0", "flags": 1, "modifiers": []}]
                    }
                }
            },
            {"q3": {"cpu_template": {"cpuid_modifiers": [{"leaf": "0x7", "subleaf": "0x0", "modifiers": []}]}}},
            {"q3": {"cpu_template": {"msr_modifiers": [{"addr": "0x10a", "bitmap": "0b0"}]}}},
            {"q3": {"cpu_template": {"vcpu_features": [{"index": 0, "bitmap": "0b1"}]}}},
            ["q3"],
        ],
    }


def corpus() -> list[tuple[str, Any]]:
    """(id, deviceConfig.resources): one field changed at a time, the list-level cases, and
    random combinations (seeded: the same corpus on every run)."""
    fields = field_values()
    cases: list[tuple[str, Any]] = []
    for key, values in fields.items():
        for i, value in enumerate(values):
            cases.append((f"{key}-{i}", [{**GOOD, key: value}]))
    cases += [
        ("resource-unknown-key", [{**GOOD, "colour": "red"}]),
        ("resource-no-name", [{"devices": ["/dev/kvm"]}]),
        ("resource-no-devices", [{"name": "ate.dev/kvm"}]),
        ("resource-scalar", ["ate.dev/kvm"]),
        ("resources-empty", []),
        ("resources-max", [{"name": f"ate.dev/r{i}", "devices": ["/dev/kvm"]} for i in range(config.MAX_RESOURCES)]),
        (
            "resources-over-max",
            [{"name": f"ate.dev/r{i}", "devices": ["/dev/kvm"]} for i in range(config.MAX_RESOURCES + 1)],
        ),
        ("cdi-name-digit", [{**GOOD, "name": "ate.dev/9kvm", "allocate": "cdi"}]),
        ("cdi-domain-digit", [{**GOOD, "name": "9ate.dev/kvm", "allocate": "both"}]),
        ("devices-name-digit", [{**GOOD, "name": "9ate.dev/9kvm", "allocate": "devices"}]),
        ("names-twice", [GOOD, {**GOOD, "devices": ["/dev/fuse"]}]),
        ("socket-collision", [{**GOOD, "name": "a.b/c"}, {**GOOD, "name": "a-b/c"}]),
        ("socket-collision-2", [{**GOOD, "name": "a/b.c"}, {**GOOD, "name": "a/b-c"}]),
        ("two-good", [GOOD, {"name": "ate.dev/tun", "devices": ["/dev/net/tun"], "units": 8}]),
        ("units-in-all-at-cap", [{**GOOD, "units": 131072}, {"name": "a.b/c", "devices": ["/dev/x"], "units": 131072}]),
        ("units-in-all-over", [{**GOOD, "units": 131072}, {"name": "a.b/c", "devices": ["/dev/x"], "units": 131073}]),
        (
            "profiles-two-names",
            [{**GOOD, "restore_profiles": {"a": {}}}, {**GOOD, "name": "a.b/c", "restore_profiles": {"b": {}}}],
        ),
        (
            "profile-twice",
            [{**GOOD, "restore_profiles": {"a": {}}}, {**GOOD, "name": "a.b/c", "restore_profiles": {"a": {}}}],
        ),
    ]
    rng = random.Random(10)
    keys = list(fields)
    for n in range(60):
        resources = []
        for _ in range(rng.randint(1, 3)):
            resource: dict[str, Any] = {"name": f"ate.dev/r{rng.randint(0, 4)}", "devices": ["/dev/kvm"]}
            for key in rng.sample(keys, rng.randint(0, 3)):
                resource[key] = rng.choice(fields[key])
            resources.append(resource)
        cases.append((f"random-{n}", resources))
    return cases


def daemon_verdict(resources: Any) -> tuple[config.ResourceConfig, ...] | ConfigError:
    try:
        accepted = resources_from_document({"version": config.CONFIG_VERSION, "resources": resources})
        check_across(accepted, PLUGIN_DIR)
    except ConfigError as exc:
        return exc
    return accepted


def _seen(r: config.ResourceConfig) -> tuple[Any, ...]:
    """Every field of the model: one the chart drops or renders otherwise differs."""
    return tuple(getattr(r, f.name) for f in dataclasses.fields(r))


def test_the_corpus_changes_every_field_of_the_file() -> None:
    named = {"cdi" if f.name.startswith("cdi_") else f.name for f in dataclasses.fields(config.ResourceConfig)}
    assert set(field_values()) == named


def helm_verdicts(helm: Helm, cases: list[tuple[str, Any]], workdir: Path) -> list[subprocess.CompletedProcess[str]]:
    def render(item: tuple[int, tuple[str, Any]]) -> subprocess.CompletedProcess[str]:
        n, (_, resources) = item
        values = workdir / f"{helm.major}-{n}.json"
        values.write_text(json.dumps({"deviceConfig": {"resources": resources}}, ensure_ascii=False))
        return helm.run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", CORPUS_RELEASE,
            "--values", str(values), "--show-only", "templates/configmap.yaml",
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(render, enumerate(cases)))


def test_the_chart_side_is_generated_from_the_model() -> None:
    """values.schema.json's deviceConfig and _deviceconfig.tpl are what the generator writes."""
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen-config-schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_corpus_has_both_verdicts_and_every_rule() -> None:
    verdicts = [daemon_verdict(r) for _, r in corpus()]
    rejected = [v for v in verdicts if isinstance(v, ConfigError)]
    assert len(rejected) > 80
    assert len(verdicts) - len(rejected) > 40
    problems = " ".join(str(e) for e in rejected)
    for words in (
        "message limit",
        "units in all",
        "collides",
        "socket path",
        "at most 64 entries",
        "requests.",
        "kubernetes.io",
        "for CDI",
        "is not a CPUID feature",
        "is defined in resources[0] already",
        "MSR modifiers are not supported",
    ):
        assert words in problems, words


def test_helm_renders_a_config_if_and_only_if_the_daemon_accepts_it(helm: Helm, tmp_path: Path) -> None:
    cases = corpus()
    mismatches = []
    for (case_id, resources), rendered in zip(cases, helm_verdicts(helm, cases, tmp_path), strict=True):
        daemon = daemon_verdict(resources)
        if rendered.returncode != 0:
            # Refused by the schema or the rules, not for the values file or the chart. (Only
            # deviceConfig differs from the defaults; helm v3 may name the wrong path.)
            assert "deviceConfig" in rendered.stderr or SCHEMA_ERROR in rendered.stderr, f"{case_id}: {rendered.stderr}"
            if not isinstance(daemon, ConfigError):
                mismatches.append(f"{case_id}: helm refuses, the daemon accepts: {rendered.stderr.strip()[-300:]}")
            continue
        if isinstance(daemon, ConfigError):
            mismatches.append(f"{case_id}: helm renders, the daemon refuses: {daemon}")
            continue
        (configmap,) = [d for d in yaml.safe_load_all(rendered.stdout) if d]
        from_chart = decode_resources(configmap["data"]["config.yaml"].encode(), "chart")
        # The same resources; env values rendered by helm are its text for a number.
        assert [_seen(r) for r in from_chart] == [_seen(r) for r in daemon], case_id
    assert not mismatches, "\n".join(mismatches)


# --- every release the chart treats differently -------------------------------------------

# Directories of the kubelet's device plugins: the default, and a longer one for the
# device-plugin variant (the one whose limit depends on the release).
PLUGIN_DIRS = (PLUGIN_DIR, "/var/lib/kubelet-alt/device-plugins")
# What the chart renders differently besides the release: the mode, and no rolling update.
VARIANTS: dict[str, dict[str, Any]] = {
    "device-plugin": {},
    "on-delete": {"updateStrategy": {"type": "OnDelete"}},
    "dra": {"dra": {"mode": "dra"}},
    "both": {"dra": {"mode": "both"}},
}
DRA_SINCE = (1, 34)  # resource.k8s.io/v1: the chart refuses DRA before (not a config rule)
NODE = "node-1"


def kube_versions() -> list[str]:
    """The oldest release Chart.yaml allows and, for each release bound the templates compare
    with (semverCompare), the releases on both sides of it."""
    oldest = re.search(r'^kubeVersion: ">=1\.(\d+)', (CHART / "Chart.yaml").read_text(), re.MULTILINE)
    assert oldest, "Chart.yaml has no kubeVersion"
    templates = " ".join(p.read_text() for p in sorted((CHART / "templates").rglob("*.*")))
    bounds = {int(m) for m in re.findall(r'semverCompare "[<>=~^!]*\s*1\.(\d+)', templates)}
    assert bounds, "no semverCompare in the templates"
    minors = {int(oldest[1])} | {m for b in bounds for m in (b - 1, b)}
    return [f"1.{m}.0" for m in sorted(minors) if m >= int(oldest[1])]


def render(helm: Helm, kube: str, values: dict[str, Any], workdir: Path, key: str) -> subprocess.CompletedProcess[str]:
    path = workdir / f"{helm.major}-{key}.json"
    path.write_text(json.dumps(values))
    return helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube,
                    "--api-versions", CLUSTER_API, "--values", str(path))  # fmt: skip


def expanded(container: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The container's args and environment as its process gets them: the downward API's
    values filled in as the kubelet fills them (metadata.uid: a UUID, as the API server
    makes every UID), then $(VAR) in the args replaced by the variable's value."""
    fields = {"metadata.uid": str(uuid.uuid4()), "spec.nodeName": NODE, "metadata.name": "ate-devplugin-x2x4z",
              "metadata.namespace": NAMESPACE}  # fmt: skip
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in container["args"]]
    return args, env


def daemon_start(container: dict[str, Any], config_text: str, workdir: Path) -> ConfigError | None:
    """What `ate-devplugin run` does with the rendered args, environment and config file
    before anything starts (cli.main, then runtime.run's config.load): None when it goes on
    to serve, the ConfigError it exits 2 with otherwise."""
    args, env = expanded(container)
    parsed = build_parser().parse_args(args)
    assert parsed.command == "run"
    config_file = workdir / "config.yaml"  # where the ConfigMap is mounted (--config)
    config_file.write_text(config_text)
    try:
        part = resolve({k: getattr(parsed, k) for k in OPTIONS}, env).part(RuntimeSettings)
        assert part.config == Path("/etc/ate-devplugin/config.yaml")
        config.load(config_file, part.plugin_dir, part.socket_suffix)
    except ConfigError as exc:
        return exc
    return None


def with_name(values: dict[str, Any], name: str) -> dict[str, Any]:
    return {**values, "deviceConfig": {"resources": [{**GOOD, "name": name}]}}


def longest_started(container: dict[str, Any], workdir: Path) -> tuple[str, str | None]:
    """The longest name ate.dev/nnn... the daemon starts on with these args, and the next
    one (None when every name up to the longest valid one starts)."""
    names = ["ate.dev/" + "n" * k for k in range(1, config.MAX_NAME_PART_CHARS + 1)]
    started = [
        n
        for n in names
        if daemon_start(container, yaml.safe_dump({"resources": [{**GOOD, "name": n}]}), workdir) is None
    ]
    assert started, "the daemon starts on no name"
    longest = started[-1]
    refused = names[len(longest) - len("ate.dev/")] if len(started) < len(names) else None
    assert started == names[: len(started)], "a longer name started after a shorter one was refused"
    return longest, refused


def test_every_release_the_chart_treats_differently_is_covered() -> None:
    """The releases below come from the templates: today 1.29, 1.33 and 1.34 (DRA), 1.35 and
    1.36 (extendedResourceName), 1.36 and 1.37 (sockets named with the pod's UID)."""
    versions = kube_versions()
    print(versions)
    assert {"1.29.0", "1.35.0", "1.36.0", "1.37.0"} <= set(versions)


def test_a_name_the_chart_renders_starts_the_daemon_on_every_release(helm: Helm, tmp_path: Path) -> None:
    cases = [
        (kube, variant, plugin_dir)
        for kube in kube_versions()
        for variant in VARIANTS
        if variant in ("device-plugin", "on-delete") or tuple(map(int, kube.split(".")[:2])) >= DRA_SINCE
        for plugin_dir in (PLUGIN_DIRS if variant == "device-plugin" else PLUGIN_DIRS[:1])
    ]

    def judge(n: int) -> list[str]:
        kube, variant, plugin_dir = cases[n]
        workdir = tmp_path / str(n)
        workdir.mkdir()
        values: dict[str, Any] = {**VARIANTS[variant], "hostPaths": {"devicePlugins": plugin_dir}}
        where = f"{kube} {variant} {plugin_dir}"
        first = render(helm, kube, with_name(values, "a/b"), workdir, "good")  # the args, whatever the name
        assert first.returncode == 0, f"{where}: {first.stderr}"
        (ds,) = daemonsets([d for d in yaml.safe_load_all(first.stdout) if d])
        longest, refused = longest_started(ds["spec"]["template"]["spec"]["containers"][0], workdir)
        problems = []
        shown = render(helm, kube, with_name(values, longest), workdir, "longest")
        if shown.returncode != 0:
            problems.append(
                f"{where}: the daemon starts on {longest!r} ({len(longest)}), helm refuses it: {shown.stderr.strip()}"
            )
        else:
            # What the chart rendered for this name starts the daemon: its args, its config.
            docs = [d for d in yaml.safe_load_all(shown.stdout) if d]
            (ds,) = daemonsets(docs)
            (configmap,) = [c for c in by_kind(docs, "ConfigMap") if "config.yaml" in c.get("data", {})]
            container = ds["spec"]["template"]["spec"]["containers"][0]
            if (error := daemon_start(container, configmap["data"]["config.yaml"], workdir)) is not None:
                problems.append(f"{where}: helm renders {longest!r}, the daemon exits 2: {error}")
        if refused is not None:
            out = render(helm, kube, with_name(values, refused), workdir, "refused")
            if out.returncode == 0:
                problems.append(f"{where}: helm renders {refused!r} ({len(refused)}), the daemon refuses it")
            elif "socket path" not in out.stderr:
                problems.append(f"{where}: helm refuses {refused!r} for another reason: {out.stderr.strip()}")
        print(f"{where}: longest name {len(longest)} characters, {'refused beyond' if refused else 'no limit hit'}")
        return problems

    with ThreadPoolExecutor(max_workers=2) as pool:
        problems = [p for found in pool.map(judge, range(len(cases))) for p in found]
    assert not problems, "\n".join(problems)
