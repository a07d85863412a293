"""Snapshot-compatible placement against this machine's own KVM (PVM here): the CPU profile
the probe records, and the commands an operator runs: a profile built of this node's
recorded one is restorable here; one asking a feature this KVM does not offer, or another
TSC frequency (this KVM cannot scale the TSC), is not, and says why.

Needs root and /dev/kvm, as the rest of tests/kvm (skipped elsewhere, a failure under CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ate_devplugin.cpu.features import FEATURE_REGISTERS, FEATURES, canonical, registers_of
from ate_devplugin.cpu.profile import CpuProfile
from ate_devplugin.kvm.facts import cpu_profile, read_node_facts
from ate_devplugin.kvm.probe import check
from tests.harness.require import require

KVM = "/dev/kvm"


@pytest.fixture(autouse=True)
def _real_kvm() -> None:
    require(os.path.exists(KVM), "no /dev/kvm on this machine")
    require(os.geteuid() == 0, "the real-device tests need root")


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def test_the_probe_records_this_nodes_guest_cpu_profile() -> None:
    result = check(KVM, 5)
    assert result.passed, result.message
    assert result.device_facts is not None
    node = read_node_facts()
    profile = cpu_profile(node, result.device_facts)
    print(json.dumps(profile.to_json(), indent=1))
    host = _cpuinfo()
    # KVM's CPUID names the CPU the kernel does, and a new vCPU ticks at the kernel's TSC rate
    assert (profile.vendor, profile.family, profile.model, profile.stepping) == (
        node.cpu_vendor, node.cpu_family, node.cpu_model, node.cpu_stepping
    )  # fmt: skip
    assert profile.tsc.khz is not None
    assert abs(profile.tsc.khz - float(host["cpu MHz"]) * 1000) <= 1
    assert profile.tsc.scaling is (result.device_facts.capabilities["tsc_control"] > 0)
    assert profile.kvm_implementation == node.kvm_implementation
    # What KVM offers a guest is not the host's flag list (on AMD it offers arch_capabilities,
    # amd_psfd, tsa_sq_no, ... that the host does not show; PVM withholds pni, avx, ...), so
    # the names are checked against the table, and the table against the bits x86-64 itself
    # fixes: any KVM offers these, and any x86-64 kernel shows them by these names.
    device = {r: v for r, v in result.device_facts.cpuid_registers.items() if r in FEATURE_REGISTERS}
    assert profile.registers == device
    assert all(canonical(f) == f for f in profile.features), sorted(f for f in profile.features if canonical(f) != f)
    assert len(profile.features) == sum(v.bit_count() for v in device.values())  # each set bit, one name
    assert registers_of(profile.features) == {r: v for r, v in device.items() if v}
    baseline = {"fpu", "tsc", "msr", "pae", "cx8", "apic", "cmov", "clflush", "mmx", "fxsr", "sse", "sse2"}
    baseline |= {"syscall", "nx", "lm"}
    flags = set(host["flags"].split())
    assert baseline <= profile.features & flags, sorted(baseline - (profile.features & flags))
    assert profile.invariant_tsc <= ({"constant_tsc", "nonstop_tsc"} <= flags)
    assert profile.has_cpuid
    assert CpuProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile
    assert check(KVM, 5).device_facts == result.device_facts  # the same device says the same of itself


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ate_devplugin", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_profile_built_here_is_restorable_here_and_one_more_demanding_is_not(tmp_path: Path) -> None:
    recorded = _cli("cpu-profile", "--device", KVM)
    assert recorded.returncode == 0, recorded.stderr
    (tmp_path / "node.json").write_text(recorded.stdout)
    node = CpuProfile.from_json(json.loads(recorded.stdout))
    built = _cli("restore-profile", "--name", "here", str(tmp_path / "node.json"))
    assert built.returncode == 0, built.stderr
    assert node.tsc.khz is not None
    lacking = sorted(set(FEATURES) - node.features)[0]  # on PVM: 3dnow
    other_khz = node.tsc.khz * 11 // 10
    profiles = yaml.safe_load(built.stdout) | {
        "one_more": {"features": [*yaml.safe_load(built.stdout)["here"]["features"], lacking]},
        # a scaling KVM would take any frequency: then only the frequency counts
        "other_tsc": {"tsc": {"khz": other_khz, "scaling": "ignore" if node.tsc.scaling else "accept"}},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"resources": [{"name": "ate.dev/kvm", "devices": [KVM],
                                                     "restore_profiles": profiles}]}, sort_keys=False))  # fmt: skip
    assert _cli("check-config", str(config)).returncode == 0
    judged = _cli("restorable", "--config", str(config), "--device", KVM)
    print(judged.stdout)
    assert judged.returncode == 1, judged.stderr
    why = "and the profile ignores scaling" if node.tsc.scaling else "and its KVM cannot scale the TSC"
    off = (node.tsc.khz - other_khz) * 100 / other_khz
    assert judged.stdout.splitlines() == [
        "ate.dev/kvm here: restorable",
        f"ate.dev/kvm one_more: not restorable: 1 feature missing: {lacking}",
        f"ate.dev/kvm other_tsc: not restorable: TSC {other_khz} kHz ± 250 ppm wanted, this node's is "
        f"{node.tsc.khz} kHz ({off:+.3g} %) {why}",
    ]
    # and the same judged from the recorded profile, as a platform would before it restores
    offline = _cli("restorable", "--config", str(config), "--profile", str(tmp_path / "node.json"))
    assert offline.stdout == judged.stdout
