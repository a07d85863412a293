"""Property-based fuzzing of the config parser (issue 6, "Bad input").

Whatever the text, ``parse_resources`` either returns resources that keep the config's
promises (checked here with the real message format, not by restating the rules:
config.py is their only definition) or raises ConfigError with a one-line message:
never any other exception. Three sources of input: YAML-ish token
soup, random mutations of valid configs, and arbitrary unicode text.

Deterministic in CI (derandomized, no example database); ``ATE_FUZZ_EXAMPLES`` raises
the number of examples for a longer run by hand.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ate_devplugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from ate_devplugin.config import (
    MAX_MESSAGE_BYTES,
    ConfigError,
    ResourceConfig,
    max_units,
    parse_resources,
    profile_entry,
)
from tests.harness.fuzz import FUZZ

# --- what an accepted config must give: checked with the real message format ---------


def as_document(resources: tuple[ResourceConfig, ...]) -> dict[str, Any]:
    return {"version": 1, "resources": [as_resource(r) for r in resources]}


def as_resource(r: ResourceConfig) -> dict[str, Any]:
    """Every field of the model as the file spells it (tests/unit/config/test_fuzz.py's
    strategies generate each: test_the_fuzzer_writes_every_field_of_the_model)."""
    mode = None if r.cdi_file_mode is None else f"{r.cdi_file_mode:04o}"
    cdi = {"file_mode": mode, "uid": r.cdi_uid, "gid": r.cdi_gid}
    return {
        "name": r.name,
        "devices": list(r.devices),
        "units": r.units,
        "permissions": r.permissions,
        "mounts": [vars(m) for m in r.mounts],
        "env": dict(r.env),
        "allocate": r.allocate,
        "cdi": {k: v for k, v in cdi.items() if v is not None},
        "preferred_allocation": r.preferred_allocation,
        **({"health": r.health} if r.health is not None else {}),
        "restore_profiles": {p.name: profile_entry(p) for p in r.restore_profiles},
    }


def check_valid(resources: tuple[ResourceConfig, ...], source: Any = None) -> None:
    """Not the rules again (config.py is their only definition) but what they promise:
    every message fits the kubelet's limit, socket files are distinct, and the model
    reads back as itself."""
    assert resources, "an accepted config has at least one resource"
    assert len({r.socket_name for r in resources}) == len(resources)
    for r in resources:
        update = pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Unhealthy") for i in r.unit_ids()])
        assert update.ByteSize() <= MAX_MESSAGE_BYTES, r.name
        answer = pb.ContainerAllocateResponse(
            envs=dict(r.env),
            mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path) for m in r.mounts],
            devices=[pb.DeviceSpec(container_path=d, host_path=d, permissions=r.permissions) for d in r.devices],
        )
        assert answer.ByteSize() <= MAX_MESSAGE_BYTES, r.name
        for d in r.devices:
            assert os.path.normpath(d) == d
            assert d.startswith("/dev/")
    assert parse_resources(yaml.safe_dump(as_document(resources))) == resources
    if isinstance(source, dict):
        # `m` (mknod) only where the input asked for it.
        for r, raw in zip(resources, source.get("resources", []), strict=False):
            asked = raw.get("permissions", "rw") if isinstance(raw, dict) else "rw"
            if "m" in r.permissions:
                assert isinstance(asked, str)
                assert "m" in asked


def parse_or_reject(text: str, source: Any = None) -> None:
    try:
        resources = parse_resources(text)
    except ConfigError as exc:
        error = exc
    else:
        check_valid(resources, source)
        return
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(f"{error.problems[0].field}: ")


# --- inputs ----------------------------------------------------------------------------

# Every field of a resource as the file names it: the model's fields, the cdi_* ones in `cdi`.
FILE_FIELDS = sorted({"cdi" if f.name.startswith("cdi_") else f.name for f in fields(ResourceConfig)})

TOKENS = [
    *list(":-[]{},\n '\"#&*!|>%@`?\t.\\/0"),
    "resources",
    "name",
    "devices",
    "units",
    "permissions",
    "mounts",
    "env",
    "container_path",
    "host_path",
    "read_only",
    "allocate",
    "cdi",
    "file_mode",
    "uid",
    "gid",
    "health",
    "preferred_allocation",
    "devices",
    "both",
    "exists",
    "kvm",
    "'0666'",
    "0660",
    "ate.dev/kvm",
    "ate.dev/",
    "/dev/kvm",
    "/dev/",
    "/dev/*",
    "rw",
    "rwm",
    "m",
    "4096",
    "-1",
    "0",
    "1e9",
    "0x1F",
    "true",
    "null",
    "~",
    "..",
    "\n  - ",
    "\n    ",
    ": ",
    "- ",
    "!!str ",
    "!!binary ",
    "!!python/name:os.system ",
    "&a ",
    "*a",
    "<<: ",
    "---\n",
    "? ",
    "\x00",
    "\u2028",
]

yamlish = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["/dev/kvm", "/dev/../etc", "//dev/x", "/dev/net/tun", "rwm", "x", "", "ate.dev/kvm"]),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

resource_names = st.one_of(
    st.sampled_from(["ate.dev/kvm", "ate.dev/tun", "example.com/gpu", "a/b", "x.y.z/n-1_2.3"]),
    st.from_regex(r"\A[a-z0-9.-]{1,20}/[A-Za-z0-9._-]{1,20}\Z"),
)
device_paths = st.one_of(
    st.sampled_from(["/dev/kvm", "/dev/net/tun", "/dev/vfio/*", "/dev/dri/renderD*", "/dev/./kvm", "/dev/a/../b"]),
    st.from_regex(r"\A/dev/[a-z0-9/._*?\[\]-]{1,20}\Z"),
)
RESOURCE_REQUIRED = {"name": resource_names, "devices": st.lists(device_paths, min_size=1, max_size=3)}
RESOURCE_OPTIONAL = {
    "units": st.integers(min_value=1, max_value=200_000),
    "permissions": st.sampled_from(["r", "w", "rw", "wr", "rwm", "m", "mr"]),
    "mounts": st.lists(
        st.fixed_dictionaries(
            {
                "container_path": st.sampled_from(["/x", "/etc/ate"]),
                "host_path": st.sampled_from(["/y", "/var/ate"]),
            },
            optional={"read_only": st.booleans()},
        ),
        max_size=2,
    ),
    "env": st.dictionaries(st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,6}\Z"), st.text(max_size=8), max_size=3),
    "allocate": st.sampled_from(["devices", "cdi", "both"]),
    "cdi": st.fixed_dictionaries(
        {},
        optional={
            "file_mode": st.sampled_from(["0666", "666", "0600", "0660"]),
            "uid": st.integers(min_value=0, max_value=70_000),
            "gid": st.integers(min_value=0, max_value=70_000),
        },
    ),
    "health": st.sampled_from(["exists", "kvm"]),
    "preferred_allocation": st.booleans(),
    "restore_profiles": st.dictionaries(
        st.from_regex(r"\A[a-z0-9](?:[a-z0-9_]{0,6}[a-z0-9])?\Z"),
        st.fixed_dictionaries(
            {},
            optional={
                "features": st.lists(st.sampled_from(["sse4_2", "avx2", "la57", "invtsc", "cpuid_7_0_ebx_22"])),
                "vendor": st.sampled_from(["GenuineIntel", "AuthenticAMD"]),
                "kvm_implementations": st.lists(st.sampled_from(["vmx", "svm", "pvm"]), unique=True),
                "tsc": st.fixed_dictionaries(
                    {},
                    optional={
                        "khz": st.integers(min_value=1, max_value=10_000_000),
                        "tolerance_ppm": st.integers(min_value=0, max_value=1_000_000),
                        "scaling": st.sampled_from(["accept", "ignore", "require"]),
                    },
                ),
            },
        ),
        max_size=3,
    ),
}
valid_resource = st.fixed_dictionaries(RESOURCE_REQUIRED, optional=RESOURCE_OPTIONAL)
valid_config = st.fixed_dictionaries({"resources": st.lists(valid_resource, min_size=1, max_size=3)})


@st.composite
def mutated_config(draw: st.DrawFn) -> dict[str, Any]:
    """A config built to be valid, then changed at a few random places."""
    doc: dict[str, Any] = draw(valid_config)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        resources = doc["resources"]
        if not isinstance(resources, list) or not resources:
            break
        i = draw(st.integers(min_value=0, max_value=len(resources) - 1))
        target = resources[i]
        action = draw(st.sampled_from(["replace", "delete", "add", "resource", "top"]))
        if action == "top":
            doc[draw(st.sampled_from(["resources", "extra"]))] = draw(junk)
        elif action == "resource":
            resources[i] = draw(junk)
        elif not isinstance(target, dict):
            continue
        elif action == "replace":
            target[draw(st.sampled_from([*sorted(target), *FILE_FIELDS]))] = draw(junk)
        elif action == "delete" and target:
            del target[draw(st.sampled_from(sorted(target)))]
        else:
            target[draw(st.text(max_size=10))] = draw(junk)
    return doc


# --- the properties --------------------------------------------------------------------


@FUZZ
@given(yamlish)
def test_yamlish_text_is_accepted_valid_or_rejected_cleanly(text: str) -> None:
    parse_or_reject(text)


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text_is_accepted_valid_or_rejected_cleanly(text: str) -> None:
    parse_or_reject(text)


@FUZZ
@given(mutated_config())
def test_mutated_configs_are_accepted_valid_or_rejected_cleanly(doc: dict[str, Any]) -> None:
    parse_or_reject(yaml.safe_dump(doc, allow_unicode=True), doc)


# Configs the parser must accept (distinct names and socket files, normal device paths),
# with or without permissions: every example is judged, none is skipped as rejected.
granting_config = st.fixed_dictionaries(
    {
        "resources": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["ate.dev/kvm", "ate.dev/tun", "example.com/gpu", "x.y.z/n-1_2.3"]),
                    "devices": st.lists(
                        st.sampled_from(["/dev/kvm", "/dev/net/tun", "/dev/vfio/*"]), min_size=1, unique=True
                    ),
                },
                optional={"permissions": st.sampled_from(["r", "w", "rw", "wr", "rwm", "m", "mr", "mw"])},
            ),
            min_size=1,
            max_size=3,
            unique_by=lambda r: r["name"],
        )
    }
)


@FUZZ
@given(granting_config)
def test_m_is_granted_only_when_asked(doc: dict[str, Any]) -> None:
    resources = parse_resources(yaml.safe_dump(doc))
    for r, raw in zip(resources, doc["resources"], strict=True):
        assert ("m" in r.permissions) == ("m" in raw.get("permissions", "rw"))


@settings(max_examples=4, derandomize=True, database=None, deadline=None)
@given(st.sampled_from([1, 3, 10, 40, 63]))
def test_unit_limit_is_exactly_the_4_mib_message_limit(prefix_len: int) -> None:
    """An independent check of the arithmetic: the largest accepted unit count, all
    Unhealthy (the longer state), fits one kubelet message; one more does not."""
    prefix = "k" * prefix_len
    limit = max_units(prefix_len)

    def size(units: int) -> int:
        response = pb.ListAndWatchResponse(
            devices=[pb.Device(ID=f"{prefix}-{n}", health="Unhealthy") for n in range(units)]
        )
        return int(response.ByteSize())

    assert size(limit) <= MAX_MESSAGE_BYTES < size(limit + 1)


def test_deeply_nested_yaml_is_a_config_error() -> None:
    """PyYAML builds nested collections recursively: thousands of levels exhaust
    Python's recursion limit. That must be reported as bad config, not crash."""
    for text in ("[" * 5000 + "]" * 5000, "- " * 3000 + "x", "{a: " * 3000 + "1" + "}" * 3000):
        with pytest.raises(ConfigError) as info:
            parse_resources(text)
        assert "\n" not in str(info.value)


def test_the_fuzzer_writes_every_field_of_the_model() -> None:
    """A new field of ResourceConfig is fuzzed too: the strategy of valid resources and the
    round trip of accepted ones name every field of the file."""
    assert sorted({*RESOURCE_REQUIRED, *RESOURCE_OPTIONAL}) == FILE_FIELDS
    written = as_resource(ResourceConfig(name="ate.dev/kvm", devices=("/dev/kvm",), health="kvm", cdi_file_mode=0o666))
    assert sorted(written) == FILE_FIELDS


_profile_junk = st.dictionaries(
    st.sampled_from(["features", "vendor", "kvm_implementations", "tsc", "cpu_template", "x"]),
    st.one_of(
        junk,
        st.lists(st.sampled_from(["avx2", "avx_2", "intel_vmx", "svm", "vmx", "zz" * 50]), max_size=5),
        st.fixed_dictionaries({}, optional={"khz": junk, "tolerance_ppm": junk, "scaling": junk}),
        st.sampled_from(["GenuineIntel", "GenuineIntelCorporation", "x" * 5000]),
    ),
    max_size=4,
)


@FUZZ
@given(st.dictionaries(st.text(max_size=30), _profile_junk, max_size=3))
def test_fuzzed_restore_profiles_are_accepted_or_rejected_cleanly(profiles: dict[str, Any]) -> None:
    """What start and a reload read (parse_resources): restore profiles of junk."""
    doc = {"resources": [{"name": "ate.dev/kvm", "devices": ["/dev/kvm"], "restore_profiles": profiles}]}
    parse_or_reject(yaml.safe_dump(doc, allow_unicode=True), doc)
