"""The config contract: the chart renders a deviceConfig IF AND ONLY IF the daemon accepts it.

The daemon's model (app/ate_devplugin/config.py) is the only definition of the rules; the
chart's side (values.schema.json's deviceConfig, templates/_deviceconfig.tpl) is generated
from it by tools/gen-config-schema.py. Here real helm (v3 and v4) judges a generated
corpus of valid, invalid and boundary configs, the daemon's own validation judges the same
data, and the verdicts must agree; what helm renders must read back, through the daemon's
file decoder, as the very resources the daemon accepted.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from ate_devplugin import config
from ate_devplugin.config import ConfigError, check_across, decode_resources, resources_from_document
from tests.harness.chart import CHART, NAMESPACE, RELEASE, REPO, Helm

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # the chart's default hostPaths.devicePlugins
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
    return (r.name, r.devices, r.units, r.permissions, r.mounts, sorted(r.env),
            r.allocate, r.cdi_file_mode, r.cdi_uid, r.cdi_gid)  # fmt: skip


def helm_verdicts(helm: Helm, cases: list[tuple[str, Any]], workdir: Path) -> list[subprocess.CompletedProcess[str]]:
    def render(item: tuple[int, tuple[str, Any]]) -> subprocess.CompletedProcess[str]:
        n, (_, resources) = item
        values = workdir / f"{helm.major}-{n}.json"
        values.write_text(json.dumps({"deviceConfig": {"resources": resources}}, ensure_ascii=False))
        return helm.run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
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
