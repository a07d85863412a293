"""A node's guest CPU profile: what a VM on this node's KVM can be given, as a platform
records it next to a snapshot (``ate-devplugin cpu-profile``) and as restore profiles are
judged against (cpu/restore.py).

It is learned where the KVM device is open (the probe, kvm/facts.py): the covered CPUID
registers of KVM_GET_SUPPORTED_CPUID (cpu/features.py names their bits), the vendor and
signature KVM reports, the TSC frequency a new vCPU gets (KVM_GET_TSC_KHZ) and whether KVM
can give a VM another one (KVM_CAP_TSC_CONTROL); the KVM implementation comes from the
node's loaded modules. Whether the TSC is invariant is the ``invtsc`` feature
(CPUID 0x80000007 edx[8]).

The JSON form is versioned (``format``, ``version``) and read back by :meth:`from_json`:
``cpuid`` holds the registers, ``features`` their names for people; when both are given
``cpuid`` is what counts (a later table may name more of its bits), so a profile edited by
hand says ``features`` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ate_devplugin.cpu.features import FEATURE_REGISTERS, Register, names, registers_of

FORMAT = "ate.dev/cpu-profile"
VERSION = 1
_COVERED = frozenset(FEATURE_REGISTERS)


class ProfileError(ValueError):
    """A recorded profile that cannot be read: the field ("" for the whole) and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        # Both may hold the file's own keys and values (a megabyte's): a line is kept short.
        self.field, self.problem = _cut(field), _cut(problem)
        super().__init__(f"{self.field}: {self.problem}" if self.field else self.problem)


def _cut(text: str, most: int = 100) -> str:
    return text if len(text) <= most else f"{text[: most - 40]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Tsc:
    khz: int | None = None  # what KVM_GET_TSC_KHZ says of a new vCPU; None where unknown (not x86)
    scaling: bool = False  # KVM_CAP_TSC_CONTROL: KVM_SET_TSC_KHZ can give a VM another frequency


@dataclass(frozen=True)
class CpuProfile:
    architecture: str  # Kubernetes' name: amd64, arm64
    vendor: str = ""  # CPUID leaf 0 as KVM reports it; "" without CPUID
    family: int | None = None
    model: int | None = None
    stepping: int | None = None
    registers: Mapping[Register, int] = field(default_factory=dict)  # the covered ones; absent is 0
    tsc: Tsc = Tsc()
    kvm_implementation: str = ""  # vmx, svm, pvm, ... (facts.py)
    cpu_model_name: str = ""  # said, never compared
    kernel_release: str = ""

    @property
    def features(self) -> frozenset[str]:
        return names(self.registers)

    @property
    def has_cpuid(self) -> bool:
        """Whether KVM told the CPUID (x86, and KVM_GET_SUPPORTED_CPUID answered)."""
        return any(self.registers.values())

    @property
    def invariant_tsc(self) -> bool:
        return "invtsc" in self.features

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "architecture": self.architecture,
            "vendor": self.vendor,
            "family": self.family,
            "model": self.model,
            "stepping": self.stepping,
            "kvm_implementation": self.kvm_implementation,
            "tsc": {"khz": self.tsc.khz, "invariant": self.invariant_tsc, "scaling": self.tsc.scaling},
            "features": sorted(self.features),
            "cpuid": {r.key(): f"{v:#010x}" for r, v in sorted(self.registers.items()) if v},
            "cpu_model_name": self.cpu_model_name,
            "kernel_release": self.kernel_release,
        }

    @classmethod
    def from_json(cls, data: Any) -> CpuProfile:
        """Raises ProfileError naming the field, on anything but a profile of this version."""
        if not isinstance(data, Mapping):
            raise ProfileError("", "a CPU profile is a JSON object")
        if data.get("format") != FORMAT:
            raise ProfileError("format", f"{data.get('format')!r} is not {FORMAT!r} (ate-devplugin cpu-profile's)")
        if data.get("version") != VERSION:
            raise ProfileError("version", f"{data.get('version')!r}: this ate-devplugin reads version {VERSION}")
        tsc = {} if data.get("tsc") is None else data["tsc"]
        if not isinstance(tsc, Mapping):
            raise ProfileError("tsc", "must be an object")
        return cls(
            architecture=_text(data, "architecture", required=True),
            vendor=_text(data, "vendor"),
            family=_count(data, "family"),
            model=_count(data, "model"),
            stepping=_count(data, "stepping"),
            registers=_registers(data),
            tsc=Tsc(khz=_count(tsc, "khz", "tsc."), scaling=_flag(tsc, "scaling", "tsc.")),
            kvm_implementation=_text(data, "kvm_implementation"),
            cpu_model_name=_text(data, "cpu_model_name"),
            kernel_release=_text(data, "kernel_release"),
        )


def _text(data: Mapping[str, Any], key: str, required: bool = False) -> str:
    value = data.get(key, "" if not required else None)
    if not isinstance(value, str) or (required and not value):
        raise ProfileError(key, f"must be {'a non-empty' if required else 'a'} string")
    return value


def _count(data: Mapping[str, Any], key: str, prefix: str = "") -> int | None:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ProfileError(prefix + key, "must be a whole number or null")
    return value


def _flag(data: Mapping[str, Any], key: str, prefix: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ProfileError(prefix + key, "must be true or false")
    return value


def _registers(data: Mapping[str, Any]) -> dict[Register, int]:
    """From ``cpuid`` when given (registers a later writer covers and this reader does not
    are left out), else from ``features``."""
    if "cpuid" in data:
        cpuid = data["cpuid"]
        if not isinstance(cpuid, Mapping):
            raise ProfileError("cpuid", 'must be an object of registers (e.g. "0x7.0.ebx": "0x00000001")')
        out: dict[Register, int] = {}
        for key, value in cpuid.items():
            try:
                register = Register.parse(key)
                number = int(value, 16) if isinstance(value, str) else value
            except ValueError as exc:
                raise ProfileError(f"cpuid.{key}", str(exc)) from None
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < 1 << 32:
                raise ProfileError(f"cpuid.{key}", "must be a 32-bit value")
            if register in _COVERED:
                out[register] = number
        return out
    features = data.get("features") or []
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise ProfileError("features", "must be a list of feature names")
    try:
        return registers_of(features)
    except ValueError as exc:
        raise ProfileError("features", str(exc)) from None
