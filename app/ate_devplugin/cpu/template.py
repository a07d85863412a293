"""Firecracker's custom CPU templates (x86), read for what they do to a guest's features.

A template's ``cpuid_modifiers`` name a leaf, a subleaf, KVM's flags and, per register, a
bitmap of 32 characters, most significant bit first: ``1`` sets the bit, ``0`` clears it,
``x`` leaves the host's (``_`` separates; a shorter bitmap is padded with ``x`` on the
left; ``0b`` may lead). Leaves and subleaves are ``0x`` or ``0b`` numbers, as Firecracker
reads them. What the guest then sees of a covered register (cpu/features.py) is the host's
bits with the ``0`` bits cleared and the ``1`` bits set: the cleared features are not
required of a node that restores its snapshot, the set ones are. Modifiers of registers
that are not feature flags (the signature, caches, topology) change what the guest sees but
nothing a restore needs: they are read and left out (:attr:`Effect.ignored`).

Firecracker's normalisation after the template (its docs: ``cpuid-normalization.md``) is
not modelled. ``msr_modifiers``, ``kvm_capabilities`` and the aarch64 fields are refused by
the config (config/schema.py), so a template is either read whole or not at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ate_devplugin.cpu.features import FEATURE_REGISTERS, REGISTER_NAMES, WIDTH, Bit, Register, name_of

# As the config's schema says them: a number of at most 32 bits, and a bitmap of at most 32 digits.
NUMBER_PATTERN = r"0x0*[0-9a-fA-F]{1,8}|0b0*[01]{1,32}"
BITMAP_PATTERN = r"(?:0b)?_*(?:[01x]_*){1,32}"
_COVERED = frozenset(FEATURE_REGISTERS)


@dataclass(frozen=True)
class Modifier:
    """One register's modifier: the bits it sets (``ones``) and clears (``zeros``)."""

    register: Register
    ones: int
    zeros: int


@dataclass(frozen=True)
class Effect:
    """What a template does to the features a guest sees."""

    sets: frozenset[str] = frozenset()
    clears: frozenset[str] = frozenset()
    ignored: tuple[str, ...] = ()  # the registers modified that are not feature flags

    def apply(self, features: Iterable[str]) -> frozenset[str]:
        """The features a guest sees of a host that offers ``features``."""
        return (frozenset(features) - self.clears) | self.sets


def number(text: str) -> int:
    """A ``0x`` or ``0b`` number (checked by NUMBER_PATTERN already)."""
    return int(text[2:], 16 if text.startswith("0x") else 2)


def bitmap(text: str) -> tuple[int, int]:
    """(bits set, bits cleared) of a bitmap checked by BITMAP_PATTERN."""
    digits = re.sub("_", "", text.removeprefix("0b"))
    ones = zeros = 0
    for position, digit in enumerate(reversed(digits)):
        if digit == "1":
            ones |= 1 << position
        elif digit == "0":
            zeros |= 1 << position
    return ones, zeros


def modifier(leaf: str, subleaf: str, register: str, bits: str) -> Modifier:
    ones, zeros = bitmap(bits)
    return Modifier(Register(number(leaf), number(subleaf), REGISTER_NAMES.index(register)), ones, zeros)


def effect(modifiers: Iterable[Modifier]) -> Effect:
    """The template's effect; a later modifier of the same bit wins, as Firecracker applies
    them in order."""
    state: dict[Bit, bool] = {}
    ignored: list[str] = []
    for m in modifiers:
        if m.register not in _COVERED:
            ignored.append(m.register.key())
            continue
        for n in range(WIDTH):
            if (m.ones | m.zeros) >> n & 1:
                state[Bit(m.register, n)] = bool(m.ones >> n & 1)
    return Effect(
        sets=frozenset(name_of(b) for b, on in state.items() if on),
        clears=frozenset(name_of(b) for b, on in state.items() if not on),
        ignored=tuple(dict.fromkeys(ignored)),
    )
