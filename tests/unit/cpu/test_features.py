"""The table of CPUID feature names: every bit of a covered register has one name, table
names and raw names read back as the same bit, and the config's pattern accepts exactly the
names the table reads."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ate_devplugin.cpu import features
from ate_devplugin.cpu.features import (
    EBX,
    FEATURE_REGISTERS,
    FEATURES,
    NAME_PATTERN,
    Bit,
    Register,
    bit_of,
    canonical,
    names,
    registers_of,
    signature,
    vendor,
)
from tests.unit.cpu.samples import PVM_REGISTERS


def test_each_name_is_one_bit_of_a_covered_register_and_each_bit_has_one_name() -> None:
    pairs = [pair for text in features._TABLE.values() for pair in zip(*[iter(text.split())] * 2, strict=True)]
    assert len(FEATURES) == len(pairs), "a name is in the table twice"
    assert len({(b.register, b.bit) for b in FEATURES.values()}) == len(FEATURES), "a bit has two names"
    assert len(set(FEATURE_REGISTERS)) == len(FEATURE_REGISTERS)
    for name, bit in FEATURES.items():
        assert bit.register in FEATURE_REGISTERS
        assert 0 <= bit.bit < 32, name
        assert re.fullmatch(r"[a-z0-9][a-z0-9_]*", name), name
        assert canonical(name) == name


def test_these_machines_registers_are_named_as_proc_cpuinfo_names_them() -> None:
    found = names(PVM_REGISTERS)
    assert {"cx16", "x2apic", "hypervisor", "la57", "gfni", "invtsc", "lm", "nx", "syscall", "rtm"} <= found
    assert {"kvm_clocksource2", "kvm_pv_unhalt", "xstate_ymm", "arat", "intel_psfd", "prefetchiti"} <= found
    assert not {"pni", "avx", "avx2", "xsave", "sse4_2", "vmx"} & found  # PVM offers a guest none of them
    assert len(found) == sum(bin(v).count("1") for v in PVM_REGISTERS.values())  # every set bit, once


def test_a_bit_the_table_does_not_name_goes_by_its_raw_name() -> None:
    unnamed = Register(0x7, 0, EBX)
    assert names({unnamed: 1 << 22}) == {"cpuid_7_0_ebx_22"}
    assert bit_of("cpuid_7_0_ebx_22") == Bit(unnamed, 22)
    assert canonical("cpuid_7_0_ebx_5") == "avx2"  # a raw name of a named bit is its name
    assert canonical("cpuid_80000008_0_ebx_0") == "clzero"
    for outside in ("cpuid_b_0_edx_1", "cpuid_7_0_ebx_32", "cpuid_7_3_edx_0", "avx3", "AVX2", "cpuid_7_0_ebx"):
        assert canonical(outside) is None, outside
    assert names({Register(0xB, 0, 3): 0xFFFFFFFF}) == frozenset()  # topology is no feature


@given(st.dictionaries(st.sampled_from(FEATURE_REGISTERS), st.integers(0, 2**32 - 1)))
def test_registers_and_names_read_each_other_back(registers: dict[Register, int]) -> None:
    set_ones = {r: v for r, v in registers.items() if v}
    assert registers_of(names(registers)) == set_ones


_RAW = st.builds(
    "cpuid_{:x}_{}_{}_{}".format,
    st.sampled_from([0x1, 0x7, 0xB, 0xD, 0x14, 0x80000001, 0x8000000A, 0x40000001, 0x12345678]),
    st.integers(0, 3),
    st.sampled_from(["eax", "ebx", "ecx", "edx", "exx"]),
    st.integers(0, 40),
)


@given(st.one_of(st.sampled_from(sorted(FEATURES)), _RAW, st.text("abcdex_0123456789", max_size=30)))
def test_the_configs_pattern_accepts_exactly_the_names_the_table_reads(name: str) -> None:
    assert (re.fullmatch(NAME_PATTERN, name) is not None) is (bit_of(name) is not None), name


def test_the_vendor_and_signature_are_read_as_the_vendors_define_them() -> None:
    intel = {Register(0, 0, 1): 0x756E6547, Register(0, 0, 3): 0x49656E69, Register(0, 0, 2): 0x6C65746E}
    assert vendor(intel) == "GenuineIntel"
    assert signature({Register(1, 0, 0): 0xA0671}) == (6, 167, 1)  # these machines' Xeon
    assert signature({Register(1, 0, 0): 0x00A00F11}) == (25, 1, 1)  # an AMD EPYC 7763: extended family
    assert signature({Register(1, 0, 0): 0x00000633}) == (6, 3, 3)  # QEMU's default: no extended model
    assert (vendor({}), signature({})) == ("", None)


def test_a_register_key_reads_back_and_refuses_other_text() -> None:
    for r in FEATURE_REGISTERS:
        assert Register.parse(r.key()) == r
    assert Register(0x80000008, 0, EBX).key() == "0x80000008.0.ebx"
    for bad in ("7.0.ebx", "0x7.0.exx", "0x7.ebx", "0x123456789.0.eax"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            Register.parse(bad)
