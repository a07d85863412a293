"""Restore profiles and the one decision: can this node restore a snapshot of that profile?

A restore profile (the config names them, config/schema.py) is what the snapshotted guest
needs of the node that restores it: features its KVM must offer (a subset of the node's),
optionally a vendor and KVM implementations, and a TSC rule. :func:`restorable` is pure:
the same profile and node profile always give the same answer, with every reason it fails.

The TSC rule follows KVM's own: a VMM restoring a snapshot asks for the snapshot's TSC
frequency (KVM_SET_TSC_KHZ); KVM takes it as is when it lies within ``tolerance_ppm`` of
the node's frequency (KVM's ``tsc_tolerance_ppm``, 250 by default), else only a node that
scales the TSC (KVM_CAP_TSC_CONTROL) gives it exactly. ``scaling`` says what a scaling node
counts for: ``accept`` (such a node passes at any frequency), ``ignore`` (the frequency
alone counts: a VMM that does not set the TSC frequency on restore) or ``require`` (only
such nodes pass, whatever their frequency). KVM without scaling also takes a frequency
above the node's by catching the guest's TSC up at every entry; that is not counted as
restorable.

:func:`baseline` makes a profile from recorded node profiles: one is "what this snapshot's
host offered", several the pool's baseline (the intersection), optionally narrowed by a
Firecracker template.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ate_devplugin.cpu.profile import CpuProfile
from ate_devplugin.cpu.template import Effect

SCALING_ACCEPT = "accept"
SCALING_IGNORE = "ignore"
SCALING_REQUIRE = "require"
SCALING = (SCALING_ACCEPT, SCALING_IGNORE, SCALING_REQUIRE)
DEFAULT_TOLERANCE_PPM = 250  # KVM's tsc_tolerance_ppm default
PPM = 1_000_000

# An answer's code: restorable, or why not (the most basic reason first, as they are said).
NO_CPUID = "no-cpuid"
VENDOR = "vendor"
IMPLEMENTATION = "kvm-implementation"
FEATURES = "missing-features"
TSC = "tsc"
RESTORABLE = "restorable"
UNKNOWN = "unknown"  # no CPU profile of the node yet: no probe has passed since the daemon started
CODES = (RESTORABLE, UNKNOWN, NO_CPUID, VENDOR, IMPLEMENTATION, FEATURES, TSC)


@dataclass(frozen=True)
class TscRule:
    khz: int | None = None  # the snapshot's TSC frequency; None: any
    tolerance_ppm: int = DEFAULT_TOLERANCE_PPM
    scaling: str = SCALING_ACCEPT


@dataclass(frozen=True)
class RestoreProfile:
    name: str
    features: frozenset[str] = frozenset()  # canonical names (cpu/features.py)
    vendor: str = ""  # "": any
    kvm_implementations: frozenset[str] = frozenset()  # empty: any
    tsc: TscRule | None = None


@dataclass(frozen=True)
class Answer:
    profile: str
    reasons: tuple[tuple[str, str], ...] = ()  # (code, sentence) for each failed rule

    @property
    def restorable(self) -> bool:
        return not self.reasons

    @property
    def code(self) -> str:
        """One word for a metric's label: ``restorable`` or the first reason's code."""
        return self.reasons[0][0] if self.reasons else RESTORABLE

    def __str__(self) -> str:
        said = "; ".join(text for _, text in self.reasons)
        return f"{self.profile}: " + (f"not restorable: {said}" if self.reasons else "restorable")


def restorable(profile: RestoreProfile, node: CpuProfile) -> Answer:
    """Whether ``node`` can restore a snapshot of ``profile``, and every reason it cannot."""
    reasons: list[tuple[str, str]] = []
    missing: tuple[str, ...] = ()
    if (profile.features or profile.vendor) and not node.has_cpuid:
        reasons.append((NO_CPUID, "this node's KVM told no CPUID (not x86, or the prober predates CPU profiles)"))
    else:
        missing = tuple(sorted(profile.features - node.features))
        if profile.vendor and node.vendor != profile.vendor:
            reasons.append((VENDOR, f"the CPU is {node.vendor or 'unknown'}, not {profile.vendor}"))
    implementations = profile.kvm_implementations
    if implementations and node.kvm_implementation not in implementations:
        here, wanted = node.kvm_implementation or "unknown", " or ".join(sorted(implementations))
        reasons.append((IMPLEMENTATION, f"KVM here is {here}, not {wanted}"))
    if missing:
        counted = f"{len(missing)} feature{'s' if len(missing) > 1 else ''}"
        reasons.append((FEATURES, f"{counted} missing: {' '.join(missing)}"))
    if profile.tsc is not None and (problem := _tsc_problem(profile.tsc, node)):
        reasons.append((TSC, problem))
    return Answer(profile.name, tuple(reasons))


def within(rule_khz: int, node_khz: int, tolerance_ppm: int) -> bool:
    """KVM's test: the frequency asked for within ``tolerance_ppm`` of the node's (integer
    arithmetic, as the kernel's)."""
    low = node_khz * (PPM - tolerance_ppm) // PPM
    high = node_khz * (PPM + tolerance_ppm) // PPM
    return low <= rule_khz <= high


def _tsc_problem(rule: TscRule, node: CpuProfile) -> str:
    scales = node.tsc.scaling
    if rule.scaling == SCALING_REQUIRE:
        return "" if scales else "this node's KVM cannot scale the TSC (KVM_CAP_TSC_CONTROL): the profile requires it"
    if rule.khz is None or (scales and rule.scaling == SCALING_ACCEPT):
        return ""
    if node.tsc.khz is None:
        return "this node's TSC frequency is unknown"
    if within(rule.khz, node.tsc.khz, rule.tolerance_ppm):
        return ""
    off = (node.tsc.khz - rule.khz) * 100 / rule.khz
    why = "and its KVM cannot scale the TSC" if rule.scaling == SCALING_ACCEPT else "and the profile ignores scaling"
    return (
        f"TSC {rule.khz} kHz ± {rule.tolerance_ppm} ppm wanted, this node's is {node.tsc.khz} kHz ({off:+.3g} %) {why}"
    )


class BaselineError(ValueError):
    """No profile serves every recorded node; ``str()`` says why and names them."""


def baseline(
    name: str,
    recorded: Sequence[tuple[str, CpuProfile]],
    template: Effect | None = None,
    tsc: bool = True,
    tolerance_ppm: int = DEFAULT_TOLERANCE_PPM,
) -> RestoreProfile:
    """The profile of snapshots any of the ``recorded`` (label, profile) nodes take, that any
    of them restores: their common vendor, KVM implementations, the features all offer
    (narrowed by ``template``, if given) and, with ``tsc``, a TSC rule all pass: their
    frequency when all agree within ``tolerance_ppm``, else scaling when all can scale.

    Raises BaselineError when there is none (no profile, no CPUID, vendors that differ,
    frequencies that differ where some node cannot scale, an unknown frequency)."""
    if not recorded:
        raise BaselineError("no recorded profile")
    for label, p in recorded:
        if not p.has_cpuid:
            raise BaselineError(f"{label}: its KVM told no CPUID ({p.architecture}): nothing to build a profile of")
    vendors = _first_labels((p.vendor, label) for label, p in recorded)
    if len(vendors) > 1:
        raise BaselineError(f"the vendors differ ({_said(vendors)}): a snapshot restores on its own vendor's CPU only")
    features = frozenset.intersection(*(p.features for _, p in recorded))
    if template is not None:
        features = template.apply(features)
    return RestoreProfile(
        name=name,
        features=features,
        vendor=recorded[0][1].vendor,
        kvm_implementations=frozenset(p.kvm_implementation for _, p in recorded if p.kvm_implementation),
        tsc=_tsc_rule(recorded, tolerance_ppm) if tsc else None,
    )


def _tsc_rule(recorded: Sequence[tuple[str, CpuProfile]], tolerance_ppm: int) -> TscRule:
    unknown = [label for label, p in recorded if p.tsc.khz is None]
    if unknown:
        raise BaselineError(f"{', '.join(unknown)}: no TSC frequency recorded (leave the TSC rule out to go on)")
    frequencies = sorted(p.tsc.khz for _, p in recorded if p.tsc.khz is not None)
    khz = frequencies[len(frequencies) // 2]
    if all(within(khz, f, tolerance_ppm) for f in frequencies):
        return TscRule(khz=khz, tolerance_ppm=tolerance_ppm)
    fixed = [label for label, p in recorded if not p.tsc.scaling]
    if not fixed:
        return TscRule(tolerance_ppm=tolerance_ppm, scaling=SCALING_REQUIRE)
    spread = _said(_first_labels((f"{p.tsc.khz} kHz", label) for label, p in recorded))
    raise BaselineError(
        f"the TSC frequencies differ by more than {tolerance_ppm} ppm ({spread}) and {', '.join(fixed)} cannot "
        "scale the TSC: build a profile per frequency, or leave the TSC rule out"
    )


def _first_labels(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each value with the first label that has it."""
    out: dict[str, str] = {}
    for value, label in pairs:
        out.setdefault(value, label)
    return out


def _said(first_labels: dict[str, str]) -> str:
    return ", ".join(f"{value or 'unknown'} ({label})" for value, label in first_labels.items())
