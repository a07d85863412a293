"""Firecracker custom CPU templates read for what they do to a guest's features: bitmaps as
Firecracker reads them, set bits required, cleared bits not, other registers left out."""

from __future__ import annotations

import re

import pytest

from ate_devplugin.cpu.template import BITMAP_PATTERN, NUMBER_PATTERN, bitmap, effect, modifier, number


def test_the_bitmap_of_firecrackers_own_example() -> None:
    """Its docs: leaf 0x1 eax, 0bxxxx000000000011xx00011011110010 clears, sets and keeps these."""
    ones, zeros = bitmap("0bxxxx000000000011xx00011011110010")
    assert zeros == 0b00001111111111000011100100001101
    assert ones == 0b00000000000000110000011011110010
    assert ~(ones | zeros) & 0xFFFFFFFF == 0b11110000000000001100000000000000


@pytest.mark.parametrize(
    ("text", "ones", "zeros"),
    [
        ("0b101", 0b101, 0b010),  # contracted: the missing leading bits are x
        ("1x0", 0b100, 0b001),  # without 0b
        ("0x1", 0b001, 0b100),  # without 0b, so x is a digit: Firecracker reads it so too
        ("0b1_0_x", 0b100, 0b010),  # _ separates
        ("0b" + "x" * 32, 0, 0),
        ("0b1" + "0" * 31, 1 << 31, (1 << 31) - 1),
    ],
)
def test_bitmaps(text: str, ones: int, zeros: int) -> None:
    assert re.fullmatch(BITMAP_PATTERN, text)
    assert bitmap(text) == (ones, zeros)


def test_the_patterns_refuse_what_firecracker_refuses_or_overflows() -> None:
    for bad in ("0b" + "1" * 33, "0b102", "", "0b", "__", "0b1 0"):
        assert not re.fullmatch(BITMAP_PATTERN, bad), bad
    for good, value in (("0x7", 7), ("0x80000001", 0x80000001), ("0b111", 7), ("0x000000007", 7)):
        assert re.fullmatch(NUMBER_PATTERN, good)
        assert number(good) == value
    for bad in ("7", "0x", "0x1ffffffff", "0o7", "0b2"):
        assert not re.fullmatch(NUMBER_PATTERN, bad), bad


def test_set_bits_are_required_cleared_ones_not_and_a_later_modifier_wins() -> None:
    done = effect(
        [
            modifier("0x7", "0x0", "ebx", "0bxxxxxxxxxxxxxxx0xxxxxxxxxx1xxxxx"),  # avx512f cleared, avx2 set
            modifier("0x1", "0x0", "ecx", "0b" + "x" * 3 + "0" + "x" * 28),  # avx cleared
            modifier("0x1", "0x0", "ecx", "0b" + "x" * 3 + "1" + "x" * 28),  # ... then set again
            modifier("0x7", "0x0", "ebx", "0bxxxxxxxxx1xxxxxxxxxxxxxxxxxxxxxx"),  # bit 22: unnamed
        ]
    )
    assert done.sets == {"avx2", "avx", "cpuid_7_0_ebx_22"}
    assert done.clears == {"avx512f"}
    assert done.ignored == ()
    assert done.apply({"avx512f", "sse2"}) == {"sse2", "avx2", "avx", "cpuid_7_0_ebx_22"}


def test_registers_that_are_not_features_are_left_out_and_said() -> None:
    done = effect(
        [
            modifier("0x1", "0x0", "eax", "0bxxxx000000000011xx00011011110010"),  # the signature
            modifier("0xb", "0x0", "edx", "0b0"),  # topology
            modifier("0x1", "0x0", "eax", "0b1"),
        ]
    )
    assert (done.sets, done.clears, done.ignored) == (frozenset(), frozenset(), ("0x1.0.eax", "0xb.0.edx"))
