"""Restore profiles in the config: read into the model (canonical names, a Firecracker
template's effect, the TSC rule's defaults), every mistake one line naming its field, a
name defined once per node, idle where no probe judges them, written back as read, and a
changed profile is a changed config (so a reload applies it)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ate_devplugin.config import (
    MAX_PROFILE_NAME_CHARS,
    MAX_RESTORE_PROFILES,
    RESTORE_PREFIX,
    ConfigError,
    check_across,
    parse_resources,
    profile_entry,
    read_again,
    restore_profile,
)
from ate_devplugin.config.rules import MAX_HINTS
from ate_devplugin.config.schema import RESTORE_PROFILES
from ate_devplugin.cpu.features import FEATURES
from ate_devplugin.cpu.restore import SCALING, SCALING_ACCEPT, SCALING_REQUIRE, RestoreProfile, TscRule
from ate_devplugin.settings.idle import idle_fields

CONFIG = """
resources:
  - name: ate.dev/kvm
    devices: [/dev/kvm]
    restore_profiles:
      q3_2026:
        vendor: GenuineIntel
        kvm_implementations: [vmx]
        features: [sse4_2, avx2, cpuid_7_0_ebx_16, cpuid_7_0_ebx_22]
        tsc: {khz: 2100000}
      fleet:
        features: [sse4_2, avx2, avx512f]
        cpu_template:
          cpuid_modifiers:
            - leaf: "0x7"
              subleaf: "0x0"
              flags: 1
              modifiers:
                - {register: ebx, bitmap: "0bxxxxxxxxxxxxxxx0xxxxxxxxxxxxxxxx"}
            - leaf: "0x1"
              subleaf: "0x0"
              flags: 0
              modifiers:
                - {register: ecx, bitmap: "0bx1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}
                - {register: eax, bitmap: "0b0000_0000_0000_0011_0000_0110_0111_0001"}
          msr_modifiers: []
      scalable:
        tsc: {scaling: require}
"""


def test_profiles_are_read_into_the_model() -> None:
    (kvm,) = parse_resources(CONFIG)
    assert kvm.restore_profiles == (  # by name
        # the template clears avx512f (7.0 ebx[16]) and sets rdrand (1 ecx[30]); leaf 1 eax is the signature
        RestoreProfile("fleet", frozenset({"sse4_2", "avx2", "rdrand"})),
        RestoreProfile(
            "q3_2026",
            frozenset({"sse4_2", "avx2", "avx512f", "cpuid_7_0_ebx_22"}),  # the raw name of a named bit is its name
            "GenuineIntel",
            frozenset({"vmx"}),
            TscRule(2_100_000, 250, SCALING_ACCEPT),
        ),
        RestoreProfile("scalable", tsc=TscRule(scaling=SCALING_REQUIRE)),
    )


def _problems(profiles: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_resources(f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: {profiles}}}]")
    return refused.value.lines()


@pytest.mark.parametrize(
    ("profiles", "line"),
    [
        (
            "{restore-2026q3: {}}",
            "restore_profiles.restore-2026q3: must be 1-24 characters of a-z, 0-9 and '_', alphanumeric at both "
            f"ends (it names the DRA attribute {RESTORE_PREFIX}<name>, a C identifier) (got 'restore-2026q3')",
        ),
        ("{" + "a" * (MAX_PROFILE_NAME_CHARS + 1) + ": {}}", "must be at most 24 characters (got 25)"),
        ("{Q3: {}}", "restore_profiles.Q3: must be 1-24 characters"),
        ("{q3_: {}}", "restore_profiles.q3_: must be 1-24 characters"),
        (
            "{q3: {features: [avx_2]}}",
            "restore_profiles.q3.features[0]: is not a CPUID feature: /proc/cpuinfo's name, or "
            "cpuid_<leaf in hex>_<subleaf>_<register>_<bit> (got 'avx_2') (hint: did you mean 'avx2'?)",
        ),
        ("{q3: {features: [cpuid_b_0_edx_1]}}", "restore_profiles.q3.features[0]: is not a CPUID feature"),
        ("{q3: {features: [avx2, avx2]}}", "restore_profiles.q3.features[1]: repeats"),
        ("{q3: {features: avx2}}", "restore_profiles.q3.features: must be a list"),
        (
            "{q3: {vendor: Intel}}",
            "restore_profiles.q3.vendor: unknown CPU vendor 'Intel' (expected GenuineIntel, AuthenticAMD, "
            "HygonGenuine or CentaurHauls)",
        ),
        (
            "{q3: {kvm_implementations: [kvm]}}",
            "restore_profiles.q3.kvm_implementations[0]: unknown KVM implementation 'kvm' (expected vmx, svm or pvm)",
        ),
        (  # a wrong name, not a string too long
            "{q3: {kvm_implementations: [intel_vmx]}}",
            "kvm_implementations[0]: unknown KVM implementation 'intel_vmx' (expected vmx, svm or pvm)",
        ),
        ("{q3: {vendor: GenuineIntelCPU}}", "restore_profiles.q3.vendor: unknown CPU vendor 'GenuineIntelCPU'"),
        ("{q3: {tsc: {khz: 0}}}", "restore_profiles.q3.tsc.khz: must be an integer from 1 to 4294967295 (got 0)"),
        ("{q3: {tsc: {tolerance_ppm: 1000001}}}", "restore_profiles.q3.tsc.tolerance_ppm: must be an integer from 0"),
        ("{q3: {tsc: {scaling: yes}}}", "restore_profiles.q3.tsc.scaling: must be a string (got True)"),
        (
            "{q3: {tsc: {scaling: maybe}}}",
            "restore_profiles.q3.tsc.scaling: unknown TSC scaling rule 'maybe' (expected accept, ignore or require)",
        ),
        ("{q3: {tsc: {khz: 1, mhz: 2}}}", "restore_profiles.q3.tsc.mhz: unknown key (hint: did you mean 'khz'?)"),
        ("{q3: {cores: 2}}", "restore_profiles.q3.cores: unknown key"),
        ("[q3]", "restore_profiles: must be a mapping of names to values (hint: write NAME: value entries, not a"),
        (
            "{q3: {cpu_template: {msr_modifiers: [{addr: '0x10a', bitmap: '0b0'}]}}}",
            "restore_profiles.q3.cpu_template.msr_modifiers: MSR modifiers are not supported: a restore profile "
            "judges CPUID and the TSC; remove them",
        ),
        (
            "{q3: {cpu_template: {kvm_capabilities: ['!56']}}}",
            "restore_profiles.q3.cpu_template.kvm_capabilities: kvm_capabilities are not supported",
        ),
        (
            "{q3: {cpu_template: {reg_modifiers: [{addr: '0x603000000013c020', bitmap: '0b0'}]}}}",
            "restore_profiles.q3.cpu_template.reg_modifiers: restore profiles read x86 CPUID: an aarch64 template",
        ),
        (
            "{q3: {cpu_template: {cpuid_modifiers: [{leaf: '7', subleaf: '0x0', flags: 1, modifiers: []}]}}}",
            "restore_profiles.q3.cpu_template.cpuid_modifiers[0].leaf: must be a number of at most 32 bits in quotes, "
            "0x... (hex) or 0b... (binary), as Firecracker reads it (got '7')",
        ),
        (
            "{q3: {cpu_template: {cpuid_modifiers: [{leaf: '0x7', subleaf: '0x0', modifiers: []}]}}}",
            "restore_profiles.q3.cpu_template.cpuid_modifiers[0].flags: is required",
        ),
        (
            "{q3: {cpu_template: {cpuid_modifiers: [{leaf: '0x7', subleaf: '0x0', flags: 1, modifiers: "
            "[{register: ebx, bitmap: '0b2'}]}]}}}",
            "restore_profiles.q3.cpu_template.cpuid_modifiers[0].modifiers[0].bitmap: must be a bitmap of at most 32",
        ),
        (
            "{q3: {cpu_template: {cpuid_modifiers: [{leaf: '0x7', subleaf: '0x0', flags: 1, modifiers: "
            "[{register: ekx, bitmap: '0b1'}]}]}}}",
            "modifiers[0].register: unknown register 'ekx' (expected eax, ebx, ecx or edx) (hint: did you mean 'edx'?)",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_its_field(profiles: str, line: str) -> None:
    (said,) = _problems(profiles)
    assert said.startswith("resources[0].")
    assert line in said


def test_at_most_this_many_profiles_fit_a_dra_device() -> None:
    """22 attributes and a capacity on the shareable device, 32 in all: a fact to spare."""
    assert 22 + 1 + MAX_RESTORE_PROFILES < 32
    many = "{" + ", ".join(f"p{i}: {{}}" for i in range(MAX_RESTORE_PROFILES + 1)) + "}"
    said = f"resources[0].restore_profiles: must have at most {MAX_RESTORE_PROFILES} entries (got 9)"
    assert _problems(many) == [said]
    assert len(RESTORE_PREFIX) + MAX_PROFILE_NAME_CHARS == 32  # a DRA attribute name's limit


def test_a_profile_name_is_defined_once_on_the_node() -> None:
    text = """resources:
- {name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: {a: {}, b: {}}}
- {name: ate.dev/kvm-cdi, devices: [/dev/kvm], allocate: cdi, restore_profiles: {b: {features: [avx2]}}}
"""
    with pytest.raises(ConfigError) as refused:
        check_across(parse_resources(text))
    assert refused.value.lines() == [
        "resources[1].restore_profiles.b: is defined in resources[0] already: its answer is one node label, so a "
        "name is defined once"
    ]


def test_profiles_on_a_resource_no_probe_judges_are_idle() -> None:
    text = """resources:
- {name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: {a: {}}}
- {name: ate.dev/kvm2, devices: [/dev/kvm], health: exists, restore_profiles: {b: {}}}
"""
    assert [str(p) for p in idle_fields(parse_resources(text), "device-plugin")] == [
        "resources[1].restore_profiles: does nothing: a profile is judged from the KVM probe's CPU profile, and this "
        "resource is not probed (hint: set health: kvm)"
    ]


_PROFILES = st.builds(
    RestoreProfile,
    st.from_regex(r"[a-z0-9](?:[a-z0-9_]{0,22}[a-z0-9])?", fullmatch=True),
    st.frozensets(st.sampled_from(sorted(FEATURES)), max_size=30),
    st.sampled_from(["", "GenuineIntel", "AuthenticAMD"]),
    st.frozensets(st.sampled_from(["vmx", "svm", "pvm"])),
    st.none()
    | st.builds(TscRule, st.none() | st.integers(1, 2**32 - 1), st.integers(0, 10**6), st.sampled_from(SCALING)),
)


@given(_PROFILES)
def test_a_profile_written_as_config_reads_back_as_it_was(profile: RestoreProfile) -> None:
    entry = {profile.name: profile_entry(profile)}
    checked = RESTORE_PROFILES.check(yaml.safe_load(yaml.safe_dump(entry)), "restore_profiles")
    assert restore_profile(profile.name, checked[profile.name]) == profile


def test_a_changed_profile_is_a_changed_config(tmp_path: Path) -> None:
    """The reload compares what it reads with what runs (reload.py): a profile's change is one."""
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    data, running = read_again(path, "/var/lib/kubelet/device-plugins", None)
    assert isinstance(running, tuple)
    path.write_text(CONFIG.replace("khz: 2100000", "khz: 2900000"))
    _, changed = read_again(path, "/var/lib/kubelet/device-plugins", data)
    assert isinstance(changed, tuple)
    assert changed != running
    assert changed[0].restore_profiles[1].tsc == TscRule(2_900_000)  # q3_2026


def test_tens_of_thousands_of_wrong_feature_names_get_few_hints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each "did you mean" scans the whole feature table: a file of ~48,000 wrong names took
    a minute to reject, and a live reload gives up after seconds. Only the first few are
    suggested for; the error still names the first field, and counts the rest."""
    asked: list[str] = []
    real = difflib.get_close_matches

    def counted(word: str, possibilities: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
        asked.append(word)
        return real(word, possibilities, n, cutoff)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    resources = [
        {
            "name": f"ate.dev/kvm{r}",
            "devices": ["/dev/kvm"],
            "units": 8,
            "restore_profiles": {f"p{p}": {"features": ["avx_2", *(f"zz{r}_{p}_{i}" for i in range(999))]}
                                 for p in range(MAX_RESTORE_PROFILES)},
        }
        for r in range(6)
    ]  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        parse_resources(yaml.safe_dump({"resources": resources}))
    error = refused.value
    assert len(error.problems) + error.omitted == 6 * MAX_RESTORE_PROFILES * 1000
    assert str(error.problems[0]) == (
        "resources[0].restore_profiles.p0.features[0]: is not a CPUID feature: /proc/cpuinfo's name, or "
        "cpuid_<leaf in hex>_<subleaf>_<register>_<bit> (got 'avx_2') (hint: did you mean 'avx2'?)"
    )
    assert len(asked) == MAX_HINTS
    asked.clear()  # the budget is the check's, not the process's: the next file has its own
    _problems("{q3: {features: [avx_2]}}")
    assert asked == ["avx_2"]


@pytest.mark.parametrize(
    ("profile", "line"),
    [
        (
            "{vendor: GenuineIntel, kvm_implementations: [svm]}",
            "resources[0].restore_profiles.q3.kvm_implementations: cannot match any node: KVM on a GenuineIntel CPU "
            "is vmx or pvm, never svm",
        ),
        (
            "{vendor: AuthenticAMD, features: [vmx, sse4_2]}",
            "resources[0].restore_profiles.q3.features: cannot match any node: vmx is the virtualization of "
            "GenuineIntel and CentaurHauls CPUs, not AuthenticAMD",
        ),
        (
            "{tsc: {khz: 2100000, tolerance_ppm: 1000000}}",
            "resources[0].restore_profiles.q3.tsc.tolerance_ppm: 1000000 ppm lets almost any TSC frequency pass: "
            "above 100000 the rule says nothing (hint: KVM's own tolerance is 250 ppm; leave khz out to accept any "
            "frequency)",
        ),
    ],
)
def test_a_profile_that_no_node_can_match_is_a_warning(profile: str, line: str) -> None:
    """Valid, so the file loads (a reload applies it), and said wherever the config is
    judged: at start, by check-config and on a reload (idle_fields, reload.py)."""
    resources = parse_resources(f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: "
                                f"{{q3: {profile}}}}}]")  # fmt: skip
    assert [str(p) for p in idle_fields(resources, "device-plugin")] == [line]


@pytest.mark.parametrize(
    "profile",
    [
        "{vendor: GenuineIntel, kvm_implementations: [vmx, pvm], features: [vmx]}",
        "{vendor: AuthenticAMD, kvm_implementations: [svm], features: [svm], tsc: {tolerance_ppm: 100000}}",
        "{kvm_implementations: [svm], features: [vmx]}",  # no vendor: a nested guest may say either
    ],
)
def test_a_profile_some_node_can_match_is_not_warned_about(profile: str) -> None:
    resources = parse_resources(f"resources: [{{name: ate.dev/kvm, devices: [/dev/kvm], restore_profiles: "
                                f"{{q3: {profile}}}}}]")  # fmt: skip
    assert list(idle_fields(resources, "device-plugin")) == []
