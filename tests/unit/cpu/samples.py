"""CPU profiles to judge: this machine's (its KVM is PVM, recorded here), and hardware nodes
of two generations and another vendor, made of feature names."""

from __future__ import annotations

from ate_devplugin.cpu.features import Register, registers_of
from ate_devplugin.cpu.profile import CpuProfile, Tsc

# KVM_GET_SUPPORTED_CPUID's covered registers on these machines (ate-devplugin cpu-profile).
PVM_REGISTERS = {
    Register.parse(key): value
    for key, value in {
        "0x1.0.ecx": 0x81202000, "0x1.0.edx": 0x0F8BFBFF, "0x6.0.eax": 0x4, "0x7.0.ebx": 0x01802852,
        "0x7.0.ecx": 0x1A010104, "0x7.0.edx": 0x20010000, "0x7.1.eax": 0x1C00, "0x7.1.edx": 0x4000,
        "0x7.2.edx": 0x1, "0xd.0.eax": 0xE7, "0x40000001.0.eax": 0x01007EFB, "0x80000001.0.ecx": 0x101,
        "0x80000001.0.edx": 0x20100800, "0x80000007.0.edx": 0x100,
    }.items()
}  # fmt: skip
PVM = CpuProfile(
    architecture="amd64",
    vendor="GenuineIntel",
    family=6,
    model=167,
    stepping=1,
    registers=PVM_REGISTERS,
    tsc=Tsc(2599998, scaling=False),
    kvm_implementation="pvm",
    cpu_model_name="Intel(R) Xeon(R) Processor",
    kernel_release="6.18.44-fc-v1147",
)

BASE = "fpu tsc msr pae cx8 apic sep cmov pat clflush mmx fxsr sse sse2 pni ssse3 cx16 sse4_1 sse4_2 popcnt x2apic"
KVM_PV = "kvm_clocksource kvm_clocksource2 kvm_async_pf kvm_steal_time kvm_pv_eoi kvm_pv_unhalt"
SKYLAKE = f"{BASE} {KVM_PV} aes xsave avx f16c rdrand fma movbe avx2 bmi1 bmi2 invtsc syscall nx lm pdpe1gb rdtscp"
ICELAKE = f"{SKYLAKE} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni gfni vaes la57 sha_ni"
MILAN = f"{BASE} {KVM_PV} aes xsave avx f16c rdrand fma movbe avx2 bmi1 bmi2 invtsc sse4a abm clzero syscall nx lm"


def hardware(features: str, vendor: str = "GenuineIntel", khz: int = 2_100_000, scaling: bool = True) -> CpuProfile:
    """A node with hardware KVM offering ``features``."""
    registers = registers_of(features.split())
    return CpuProfile("amd64", vendor, registers=registers, tsc=Tsc(khz, scaling), kvm_implementation=_KVM[vendor])


_KVM = {"GenuineIntel": "vmx", "AuthenticAMD": "svm"}
