"""x86 CPUID feature bits by name: the one table that node profiles, restore profiles and
Firecracker templates are read with.

The registers covered are the feature-flag registers of the leaves a VMM passes on to its
guest from KVM_GET_SUPPORTED_CPUID: leaf 1, 6, 7 (subleaves 0-2), 0xd (0 and 1: the XSAVE
state components and instructions), 0x14 (Intel PT), 0x80000001, 0x80000007, 0x80000008,
0x8000000a (SVM, for nested guests), 0x80000021 and KVM's own 0x40000001 (paravirtual
features). Not covered: the signature, cache, topology and size leaves (0x1 eax/ebx, 0x4,
0xb, 0x1f, 0xd's sizes), which are not features, and Key Locker (0x19), which KVM does not
offer.

A bit's name is the one /proc/cpuinfo shows where Linux shows the bit, else the lower-case
name of the kernel's (or KVM's) X86_FEATURE_ macro; KVM's paravirtual bits are ``kvm_``
and its KVM_FEATURE_ name, XSAVE state components ``xstate_`` and the XFEATURE_ name, Intel
PT capabilities ``pt_`` and the name the kernel's PT driver gives them; 0x80000007 edx[8]
is ``invtsc`` (QEMU's name: Linux shows it as constant_tsc and nonstop_tsc). A set bit of a
covered register that the table does not name is a feature all the same, under its raw
name ``cpuid_<leaf in hex>_<subleaf>_<register>_<bit>`` (``cpuid_7_0_ebx_22``): nothing KVM
offers is lost when the table lags the kernel, and a later table that names the bit reads
the raw name as the new one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

EAX, EBX, ECX, EDX = range(4)
REGISTER_NAMES = ("eax", "ebx", "ecx", "edx")
WIDTH = 32


@dataclass(frozen=True, order=True)
class Register:
    """One 32-bit register of a CPUID leaf and subleaf."""

    leaf: int
    subleaf: int
    register: int  # EAX, EBX, ECX or EDX

    def key(self) -> str:
        """``0x7.0.ebx``: how a profile's JSON names it."""
        return f"{self.leaf:#x}.{self.subleaf}.{REGISTER_NAMES[self.register]}"

    @classmethod
    def parse(cls, key: str) -> Register:
        """The register of a key; raises ValueError."""
        match = re.fullmatch(r"0x([0-9a-f]{1,8})\.([0-9]{1,10})\.(e[abcd]x)", key)
        if match is None:
            raise ValueError(f"{key!r} is not a CPUID register (e.g. 0x7.0.ebx)")
        return cls(int(match[1], 16), int(match[2]), REGISTER_NAMES.index(match[3]))


@dataclass(frozen=True, order=True)
class Bit:
    register: Register
    bit: int


# Each covered register and the names of its bits, as "bit name" pairs.
_TABLE: dict[tuple[int, int, int], str] = {
    (0x1, 0, EDX): "0 fpu 1 vme 2 de 3 pse 4 tsc 5 msr 6 pae 7 mce 8 cx8 9 apic 11 sep 12 mtrr 13 pge 14 mca 15 cmov "
    "16 pat 17 pse36 18 pn 19 clflush 21 dts 22 acpi 23 mmx 24 fxsr 25 sse 26 sse2 27 ss 28 ht 29 tm 30 ia64 31 pbe",
    (0x1, 0, ECX): "0 pni 1 pclmulqdq 2 dtes64 3 monitor 4 ds_cpl 5 vmx 6 smx 7 est 8 tm2 9 ssse3 10 cid 11 sdbg "
    "12 fma 13 cx16 14 xtpr 15 pdcm 17 pcid 18 dca 19 sse4_1 20 sse4_2 21 x2apic 22 movbe 23 popcnt "
    "24 tsc_deadline_timer 25 aes 26 xsave 27 osxsave 28 avx 29 f16c 30 rdrand 31 hypervisor",
    (0x6, 0, EAX): "0 dtherm 1 ida 2 arat 4 pln 6 pts 7 hwp 8 hwp_notify 9 hwp_act_window 10 hwp_epp 11 hwp_pkg_req "
    "15 hwp_highest_perf_change 19 hfi",
    (0x7, 0, EBX): "0 fsgsbase 1 tsc_adjust 2 sgx 3 bmi1 4 hle 5 avx2 6 fdp_excptn_only 7 smep 8 bmi2 9 erms "
    "10 invpcid 11 rtm 12 cqm 13 zero_fcs_fds 14 mpx 15 rdt_a 16 avx512f 17 avx512dq 18 rdseed 19 adx 20 smap "
    "21 avx512ifma 23 clflushopt 24 clwb 25 intel_pt 26 avx512pf 27 avx512er 28 avx512cd 29 sha_ni 30 avx512bw "
    "31 avx512vl",
    (0x7, 0, ECX): "1 avx512vbmi 2 umip 3 pku 4 ospke 5 waitpkg 6 avx512_vbmi2 7 shstk 8 gfni 9 vaes 10 vpclmulqdq "
    "11 avx512_vnni 12 avx512_bitalg 13 tme 14 avx512_vpopcntdq 16 la57 22 rdpid 24 bus_lock_detect 25 cldemote "
    "27 movdiri 28 movdir64b 29 enqcmd 30 sgx_lc",
    (0x7, 0, EDX): "2 avx512_4vnniw 3 avx512_4fmaps 4 fsrm 8 avx512_vp2intersect 9 srbds_ctrl 10 md_clear "
    "11 rtm_always_abort 13 tsx_force_abort 14 serialize 15 hybrid_cpu 16 tsxldtrk 18 pconfig 19 arch_lbr 20 ibt "
    "22 amx_bf16 23 avx512_fp16 24 amx_tile 25 amx_int8 26 spec_ctrl 27 intel_stibp 28 flush_l1d "
    "29 arch_capabilities 30 core_capabilities 31 spec_ctrl_ssbd",
    (0x7, 1, EAX): "0 sha512 1 sm3 2 sm4 4 avx_vnni 5 avx512_bf16 7 cmpccxadd 8 arch_perfmon_ext 10 fzrm 11 fsrs "
    "12 fsrc 17 fred 18 lkgs 19 wrmsrns 21 amx_fp16 23 avx_ifma 26 lam",
    (0x7, 1, ECX): "5 msr_imm",
    (0x7, 1, EDX): "4 avx_vnni_int8 5 avx_ne_convert 8 amx_complex 10 avx_vnni_int16 14 prefetchiti 19 avx10",
    (0x7, 2, EDX): "0 intel_psfd 1 ipred_ctrl 2 rrsba_ctrl 3 ddpd_u 4 bhi_ctrl 5 mcdt_no",
    # XCR0's components (user state) and, in 0xd.1 ecx, IA32_XSS's (supervisor state)
    (0xD, 0, EAX): "0 xstate_fp 1 xstate_sse 2 xstate_ymm 3 xstate_bndregs 4 xstate_bndcsr 5 xstate_opmask "
    "6 xstate_zmm_hi256 7 xstate_hi16_zmm 9 xstate_pkru 17 xstate_xtile_cfg 18 xstate_xtile_data 19 xstate_apx",
    (0xD, 0, EDX): "",
    (0xD, 1, EAX): "0 xsaveopt 1 xsavec 2 xgetbv1 3 xsaves 4 xfd",
    (0xD, 1, ECX): "8 xstate_pt 10 xstate_pasid 11 xstate_cet_user 12 xstate_cet_kernel 15 xstate_lbr",
    (0x14, 0, EBX): "0 pt_cr3_filtering 1 pt_psb_cyc 2 pt_ip_filtering 3 pt_mtc 4 pt_ptwrite 5 pt_power_event_trace "
    "7 pt_event_trace 8 pt_tnt_disable",
    (0x14, 0, ECX): "0 pt_topa_output 1 pt_topa_multiple_entries 2 pt_single_range_output 3 pt_output_subsys "
    "31 pt_payloads_lip",
    # On AMD, bits 0-9, 12-17, 23 and 24 of 0x80000001 edx repeat leaf 1's: unnamed, as Linux leaves them.
    (0x80000001, 0, EDX): "11 syscall 19 mp 20 nx 22 mmxext 25 fxsr_opt 26 pdpe1gb 27 rdtscp 29 lm 30 3dnowext "
    "31 3dnow",
    (0x80000001, 0, ECX): "0 lahf_lm 1 cmp_legacy 2 svm 3 extapic 4 cr8_legacy 5 abm 6 sse4a 7 misalignsse "
    "8 3dnowprefetch 9 osvw 10 ibs 11 xop 12 skinit 13 wdt 15 lwp 16 fma4 17 tce 19 nodeid_msr 21 tbm 22 topoext "
    "23 perfctr_core 24 perfctr_nb 26 bpext 27 ptsc 28 perfctr_llc 29 mwaitx",
    (0x80000007, 0, EDX): "8 invtsc",
    (0x80000008, 0, EBX): "0 clzero 1 irperf 2 xsaveerptr 4 rdpru 9 wbnoinvd 12 amd_ibpb 14 amd_ibrs 15 amd_stibp "
    "16 amd_ibrs_always_on 17 amd_stibp_always_on 18 amd_ibrs_preferred 19 amd_ibrs_same_mode 23 amd_ppin "
    "24 amd_ssbd 25 virt_ssbd 26 amd_ssb_no 27 cppc 28 amd_psfd 29 btc_no 31 brs",
    (0x8000000A, 0, EDX): "0 npt 1 lbrv 2 svm_lock 3 nrip_save 4 tsc_scale 5 vmcb_clean 6 flushbyasid "
    "7 decodeassists 10 pausefilter 12 pfthreshold 13 avic 15 v_vmsave_vmload 16 vgif 18 x2avic 20 v_spec_ctrl "
    "25 vnmi 28 svme_addr_chk",
    (0x80000021, 0, EAX): "0 no_nested_data_bp 1 wrmsr_xx_base_ns 2 lfence_rdtsc 6 null_sel_clr_base 8 autoibrs "
    "9 no_smm_ctl_msr 27 sbpb 28 ibpb_brtype 29 srso_no",
    (0x80000021, 0, ECX): "1 tsa_sq_no 2 tsa_l1_no",
    (0x40000001, 0, EAX): "0 kvm_clocksource 1 kvm_nop_io_delay 2 kvm_mmu_op 3 kvm_clocksource2 4 kvm_async_pf "
    "5 kvm_steal_time 6 kvm_pv_eoi 7 kvm_pv_unhalt 9 kvm_pv_tlb_flush 10 kvm_async_pf_vmexit 11 kvm_pv_send_ipi "
    "12 kvm_poll_control 13 kvm_pv_sched_yield 14 kvm_async_pf_int 15 kvm_msi_ext_dest_id 16 kvm_hc_map_gpa_range "
    "17 kvm_migration_control 24 kvm_clocksource_stable_bit",
}
FEATURE_REGISTERS: tuple[Register, ...] = tuple(Register(*r) for r in _TABLE)
FEATURES: Mapping[str, Bit] = {
    name: Bit(Register(*r), int(bit))
    for r, pairs in _TABLE.items()
    for bit, name in zip(pairs.split()[::2], pairs.split()[1::2], strict=True)
}
_NAMES: Mapping[Bit, str] = {bit: name for name, bit in FEATURES.items()}
_RAW = re.compile(r"cpuid_([0-9a-f]{1,8})_([0-9]{1,10})_(e[abcd]x)_([0-9]{1,2})")
_COVERED = frozenset(FEATURE_REGISTERS)

# Every name a profile may require, as one regex (the config's schema says the same): the
# table's names, or a raw name of a covered register.
NAME_PATTERN = "|".join(
    [
        *sorted(FEATURES),
        "cpuid_(?:{})_(?:[0-9]|[12][0-9]|3[01])".format(
            "|".join(f"{r.leaf:x}_{r.subleaf}_{REGISTER_NAMES[r.register]}" for r in FEATURE_REGISTERS)
        ),
    ]
)
MAX_NAME_CHARS = max(max(map(len, FEATURES)), len("cpuid_ffffffff_0_eax_31"))


# Not features: the vendor string (leaf 0) and the family/model/stepping signature (leaf 1 eax).
IDENTITY_REGISTERS = (Register(0x0, 0, EBX), Register(0x0, 0, EDX), Register(0x0, 0, ECX), Register(0x1, 0, EAX))


def vendor(registers: Mapping[Register, int]) -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ...: leaf 0's ebx, edx, ecx as text; "" without them."""
    text = b"".join(registers.get(r, 0).to_bytes(4, "little") for r in IDENTITY_REGISTERS[:3])
    return text.decode("latin-1").strip("\0 ")


def signature(registers: Mapping[Register, int]) -> tuple[int, int, int] | None:
    """(family, model, stepping) of leaf 1 eax, with the extended family and model where the
    vendors' rule adds them (family 0xf, and model for family 6 too); None without it."""
    eax = registers.get(IDENTITY_REGISTERS[3], 0)
    if not eax:
        return None
    family, model, stepping = eax >> 8 & 0xF, eax >> 4 & 0xF, eax & 0xF
    if family in (0x6, 0xF):
        model += (eax >> 16 & 0xF) << 4
    if family == 0xF:
        family += eax >> 20 & 0xFF
    return family, model, stepping


def raw_name(bit: Bit) -> str:
    r = bit.register
    return f"cpuid_{r.leaf:x}_{r.subleaf}_{REGISTER_NAMES[r.register]}_{bit.bit}"


def name_of(bit: Bit) -> str:
    return _NAMES.get(bit) or raw_name(bit)


def bit_of(name: str) -> Bit | None:
    """The bit a name stands for (a table name, or a raw name of a covered register); None
    for any other name."""
    if (bit := FEATURES.get(name)) is not None:
        return bit
    match = _RAW.fullmatch(name)
    if match is None:
        return None
    register = Register(int(match[1], 16), int(match[2]), REGISTER_NAMES.index(match[3]))
    number = int(match[4])
    return Bit(register, number) if register in _COVERED and number < WIDTH else None


def canonical(name: str) -> str | None:
    """The name a feature goes by: a raw name of a bit the table names is that name."""
    bit = bit_of(name)
    return None if bit is None else name_of(bit)


def names(registers: Mapping[Register, int]) -> frozenset[str]:
    """The features set in the covered registers (any other register is left out)."""
    return frozenset(
        name_of(Bit(r, n)) for r in FEATURE_REGISTERS for n in range(WIDTH) if registers.get(r, 0) >> n & 1
    )


def registers_of(features: Iterable[str]) -> dict[Register, int]:
    """The covered registers with these features set; raises ValueError on a name that is
    no feature."""
    out: dict[Register, int] = {}
    for name in features:
        bit = bit_of(name)
        if bit is None:
            raise ValueError(f"{name!r} is not a CPUID feature")
        out[bit.register] = out.get(bit.register, 0) | 1 << bit.bit
    return out
