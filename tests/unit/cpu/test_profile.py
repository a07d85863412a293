"""The recorded CPU profile's JSON: it reads back as it was written, a hand-written one of
feature names reads too, and what is not a profile of this version is refused naming the
field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ate_devplugin.cpu.profile import FORMAT, VERSION, CpuProfile, ProfileError, Tsc
from tests.unit.cpu.samples import PVM


def test_a_recorded_profile_reads_back_as_it_was() -> None:
    written = json.loads(json.dumps(PVM.to_json()))
    assert written["format"] == FORMAT
    assert written["version"] == VERSION
    assert written["tsc"] == {"khz": 2599998, "invariant": True, "scaling": False}
    assert written["cpuid"]["0x7.0.ebx"] == "0x01802852"
    assert written["features"] == sorted(PVM.features)
    assert CpuProfile.from_json(written) == PVM
    assert len(json.dumps(written)) < 4096  # what a platform keeps next to each snapshot


def test_a_hand_written_profile_of_feature_names_reads() -> None:
    written = {"format": FORMAT, "version": 1, "architecture": "amd64", "features": ["avx2", "cpuid_7_0_ebx_22"]}
    read = CpuProfile.from_json(written)
    assert read.features == {"avx2", "cpuid_7_0_ebx_22"}
    assert (read.vendor, read.tsc, read.invariant_tsc, read.has_cpuid) == ("", Tsc(), False, True)


def test_the_registers_count_where_both_are_given_and_unknown_registers_are_left_out() -> None:
    written = {
        **PVM.to_json(),
        "features": ["avx512f"],  # a later table's names, or an edit: the registers say what was offered
        "cpuid": {**PVM.to_json()["cpuid"], "0x24.0.ebx": "0x00000007"},  # a register a later writer covers
    }
    assert CpuProfile.from_json(written).registers == PVM.registers


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"format": "other"}, "format", "'other' is not 'ate.dev/cpu-profile'"),
        ({"version": 2}, "version", "2: this ate-devplugin reads version 1"),
        ({"architecture": ""}, "architecture", "must be a non-empty string"),
        ({"model": "167"}, "model", "must be a whole number or null"),
        ({"tsc": {"khz": -1}}, "tsc.khz", "must be a whole number or null"),
        ({"tsc": {"scaling": "yes"}}, "tsc.scaling", "must be true or false"),
        ({"tsc": []}, "tsc", "must be an object"),
        ({"cpuid": {"7.0.ebx": "0x1"}}, "cpuid.7.0.ebx", "'7.0.ebx' is not a CPUID register"),
        ({"cpuid": {"0x7.0.ebx": "0x100000000"}}, "cpuid.0x7.0.ebx", "must be a 32-bit value"),
        ({"cpuid": {"0x7.0.ebx": "zz"}}, "cpuid.0x7.0.ebx", "invalid literal"),
        ({"cpuid": ["0x7.0.ebx"]}, "cpuid", "must be an object of registers"),
    ],
)
def test_what_is_not_a_profile_is_refused_naming_the_field(change: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ProfileError) as refused:
        CpuProfile.from_json({**PVM.to_json(), **change})
    assert refused.value.field == field
    assert problem in refused.value.problem


def test_names_that_are_no_feature_and_documents_that_are_no_object_are_refused() -> None:
    written = {"format": FORMAT, "version": 1, "architecture": "amd64", "features": ["avx3"]}
    with pytest.raises(ProfileError, match="features: 'avx3' is not a CPUID feature"):
        CpuProfile.from_json(written)
    with pytest.raises(ProfileError, match="must be a list of feature names"):
        CpuProfile.from_json({**written, "features": "avx2"})
    with pytest.raises(ProfileError, match="a CPU profile is a JSON object") as refused:
        CpuProfile.from_json([written])
    assert refused.value.field == ""
