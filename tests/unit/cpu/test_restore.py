"""The decision, as a table: which profiles each node can restore and why not; its laws as
properties; and the profiles built of recorded nodes (one, a pool, a pool and a template)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ate_devplugin.cpu.features import FEATURES
from ate_devplugin.cpu.profile import CpuProfile, Tsc
from ate_devplugin.cpu.restore import (
    CODES,
    SCALING_ACCEPT,
    SCALING_IGNORE,
    SCALING_REQUIRE,
    Answer,
    BaselineError,
    RestoreProfile,
    TscRule,
    baseline,
    restorable,
    within,
)
from ate_devplugin.cpu.template import Effect
from tests.unit.cpu.samples import ICELAKE, MILAN, PVM, SKYLAKE, hardware

SKY = hardware(SKYLAKE)
ICE = hardware(ICELAKE, khz=2_900_000)
AMD = hardware(MILAN, "AuthenticAMD", khz=2_450_000)
FIXED_TSC = hardware(SKYLAKE, scaling=False)  # the same CPU, a KVM that cannot scale the TSC
ARM = CpuProfile("arm64", kvm_implementation="arm64")


def lacking(answer: Answer) -> tuple[str, ...]:
    """The features an answer says the node lacks, read from its reason as on-call reads it."""
    said = [text.split("missing: ", 1)[1] for code, text in answer.reasons if code == "missing-features"]
    return tuple(said[0].split()) if said else ()


def profile(features: str = "", **fields: object) -> RestoreProfile:
    return RestoreProfile("p", frozenset(features.split()), **fields)  # type: ignore[arg-type]


EVERYTHING = profile("avx512f", vendor="AuthenticAMD", kvm_implementations=frozenset({"svm"}), tsc=TscRule(1_000_000))
CASES = [
    # (profile, node, code, missing, said)
    (profile(SKYLAKE), SKY, "restorable", "", ""),
    (profile(SKYLAKE), ICE, "restorable", "", ""),  # a newer generation takes an older snapshot
    (profile(ICELAKE), SKY, "missing-features", " ".join(ICE.features - SKY.features), "10 features missing: avx512_"),
    (profile("avx2"), PVM, "missing-features", "avx2", "1 feature missing: avx2"),
    (profile("cx16 la57 invtsc kvm_pv_unhalt"), PVM, "restorable", "", ""),
    (profile("sse2", vendor="GenuineIntel"), AMD, "vendor", "", "the CPU is AuthenticAMD, not GenuineIntel"),
    (profile("sse4a", vendor="AuthenticAMD"), AMD, "restorable", "", ""),
    (profile(kvm_implementations=frozenset({"vmx", "svm"})), PVM, "kvm-implementation", "", "pvm, not svm or vmx"),
    (profile(kvm_implementations=frozenset({"pvm"})), PVM, "restorable", "", ""),
    (profile("sse2"), ARM, "no-cpuid", "", "this node's KVM told no CPUID"),
    (profile(vendor="GenuineIntel"), ARM, "no-cpuid", "", "told no CPUID"),
    (profile(), ARM, "restorable", "", ""),  # nothing asked, nothing missing
    # the TSC: within KVM's tolerance, scaled, or neither
    (profile(tsc=TscRule(2_100_000)), SKY, "restorable", "", ""),
    (profile(tsc=TscRule(2_100_525)), FIXED_TSC, "restorable", "", ""),  # +250 ppm of the node's: still within
    (profile(tsc=TscRule(2_100_526)), FIXED_TSC, "tsc", "", "this node's is 2100000 kHz (-0.025 %) and its KVM cannot"),
    (profile(tsc=TscRule(2_599_998)), SKY, "restorable", "", ""),  # far off, but this KVM scales
    (profile(tsc=TscRule(2_599_998, scaling=SCALING_IGNORE)), SKY, "tsc", "", "and the profile ignores scaling"),
    (profile(tsc=TscRule(2_599_998, 250, SCALING_ACCEPT)), PVM, "restorable", "", ""),  # the very frequency
    (profile(tsc=TscRule(2_100_000)), PVM, "tsc", "", "± 250 ppm wanted, this node's is 2599998 kHz (+23.8 %)"),
    (profile(tsc=TscRule(2_100_000, tolerance_ppm=300_000)), PVM, "restorable", "", ""),
    (profile(tsc=TscRule(scaling=SCALING_REQUIRE)), SKY, "restorable", "", ""),
    (profile(tsc=TscRule(scaling=SCALING_REQUIRE)), PVM, "tsc", "", "cannot scale the TSC (KVM_CAP_TSC_CONTROL)"),
    (profile(tsc=TscRule()), PVM, "restorable", "", ""),  # no frequency asked
    (profile(tsc=TscRule(2_100_000)), replace(PVM, tsc=Tsc()), "tsc", "", "this node's TSC frequency is unknown"),
    (profile(tsc=TscRule(2_100_000)), replace(SKY, tsc=Tsc(None, True)), "restorable", "", ""),  # it scales to any
    # every reason at once, the most basic first
    (EVERYTHING, PVM, "vendor", "avx512f", "not AuthenticAMD; KVM here is pvm, not svm; 1 feature missing: avx512f"),
]


@pytest.mark.parametrize(("wanted", "node", "code", "missing", "said"), CASES)
def test_the_decision(wanted: RestoreProfile, node: CpuProfile, code: str, missing: str, said: str) -> None:
    answer = restorable(wanted, node)
    assert (answer.code, answer.restorable) == (code, code == "restorable")
    assert lacking(answer) == tuple(sorted(missing.split()))
    assert said in str(answer)
    assert str(answer).startswith("p: restorable" if answer.restorable else "p: not restorable: ")
    assert answer.code in CODES


def test_every_reason_is_said_the_most_basic_first() -> None:
    answer = restorable(EVERYTHING, PVM)
    assert [code for code, _ in answer.reasons] == ["vendor", "kvm-implementation", "missing-features", "tsc"]
    assert str(answer).endswith("TSC 1000000 kHz ± 250 ppm wanted, this node's is 2599998 kHz (+160 %) and its KVM "
                                "cannot scale the TSC")  # fmt: skip


def test_kvms_tolerance_is_its_integer_arithmetic_around_the_nodes_frequency() -> None:
    assert within(2_100_525, 2_100_000, 250)
    assert not within(2_100_526, 2_100_000, 250)
    assert within(2_099_475, 2_100_000, 250)
    assert not within(2_099_474, 2_100_000, 250)
    assert within(2_100_000, 2_100_000, 0)


_NAMES = st.frozensets(st.sampled_from(sorted(FEATURES)), max_size=40)
_NODES = st.builds(
    lambda f, khz, scaling: hardware(" ".join(f) or "fpu", khz=khz, scaling=scaling),
    _NAMES,
    st.integers(1_000_000, 4_000_000),
    st.booleans(),
)


@given(_NODES, _NAMES)
def test_a_node_restores_what_it_offers_and_no_feature_it_lacks(node: CpuProfile, extra: frozenset[str]) -> None:
    assert restorable(RestoreProfile("own", node.features), node).restorable
    wanted = RestoreProfile("more", node.features | extra)
    assert lacking(restorable(wanted, node)) == tuple(sorted(extra - node.features))


@given(_NODES, _NAMES, _NAMES)
def test_asking_less_or_offering_more_never_turns_a_yes_into_a_no(
    node: CpuProfile, asked: frozenset[str], more: frozenset[str]
) -> None:
    wanted = RestoreProfile("p", asked)
    if restorable(wanted, node).restorable:
        assert restorable(RestoreProfile("p", frozenset(list(asked)[: len(asked) // 2])), node).restorable
        richer = hardware(" ".join(node.features | more), khz=node.tsc.khz or 1, scaling=node.tsc.scaling)
        assert restorable(wanted, richer).restorable


@given(st.lists(_NODES, min_size=1, max_size=5))
def test_a_pools_baseline_is_restorable_on_every_node_it_was_built_of(nodes: list[CpuProfile]) -> None:
    recorded = [(f"node-{i}.json", n) for i, n in enumerate(nodes)]
    frequencies = sorted(n.tsc.khz or 0 for n in nodes)
    one_frequency = all(within(frequencies[len(frequencies) // 2], f, 250) for f in frequencies)  # 1 ppm apart is one
    if one_frequency or all(n.tsc.scaling for n in nodes):
        built = baseline("pool", recorded)
    else:  # frequencies that differ where a node cannot scale: no TSC rule serves them all
        with pytest.raises(BaselineError, match="cannot scale the TSC"):
            baseline("pool", recorded)
        built = baseline("pool", recorded, tsc=False)
    for _, node in recorded:
        assert restorable(built, node).restorable, node


def test_one_recorded_profile_is_what_that_host_offered() -> None:
    built = baseline("here", [("pvm.json", PVM)])
    assert built == RestoreProfile(
        "here", PVM.features, "GenuineIntel", frozenset({"pvm"}), TscRule(2_599_998, 250, SCALING_ACCEPT)
    )


def test_a_pool_of_two_generations_is_their_intersection() -> None:
    built = baseline("pool", [("sky.json", SKY), ("ice.json", replace(ICE, tsc=SKY.tsc))])
    assert built.features == SKY.features  # Ice Lake offers all of Skylake's
    assert built.tsc == TscRule(2_100_000)
    assert restorable(built, ICE).restorable


def test_a_pool_of_frequencies_needs_scaling_everywhere() -> None:
    assert baseline("pool", [("sky.json", SKY), ("ice.json", ICE)]).tsc == TscRule(scaling=SCALING_REQUIRE)
    with pytest.raises(BaselineError, match=r"differ by more than 250 ppm \(2100000 kHz \(fixed.json\), 2900000 kHz "
                       r"\(ice.json\)\) and fixed.json cannot scale"):  # fmt: skip
        baseline("pool", [("fixed.json", FIXED_TSC), ("ice.json", ICE)])
    assert baseline("pool", [("fixed.json", FIXED_TSC), ("ice.json", ICE)], tsc=False).tsc is None
    near = replace(FIXED_TSC, tsc=Tsc(2_100_400, False))  # 190 ppm off: one frequency
    assert baseline("pool", [("a", FIXED_TSC), ("b", near), ("c", FIXED_TSC)]).tsc == TscRule(2_100_000)


def test_what_no_profile_can_serve_is_refused_naming_the_nodes() -> None:
    with pytest.raises(BaselineError, match=r"vendors differ \(GenuineIntel \(sky.json\), AuthenticAMD \(amd.json\)\)"):
        baseline("pool", [("sky.json", SKY), ("amd.json", AMD)])
    with pytest.raises(BaselineError, match=r"arm\.json: its KVM told no CPUID"):
        baseline("pool", [("sky.json", SKY), ("arm.json", ARM)])
    with pytest.raises(BaselineError, match=r"old\.json: no TSC frequency recorded"):
        baseline("pool", [("old.json", replace(SKY, tsc=Tsc()))])
    with pytest.raises(BaselineError, match="no recorded profile"):
        baseline("pool", [])


def test_a_template_narrows_the_baseline() -> None:
    template = Effect(sets=frozenset({"hypervisor"}), clears=frozenset({"avx2", "bmi2", "la57"}))
    built = baseline("t2cl_like", [("sky.json", SKY), ("ice.json", ICE)], template, tsc=False)
    assert built.features == (SKY.features - {"avx2", "bmi2"}) | {"hypervisor"}
    assert lacking(restorable(built, SKY)) == ("hypervisor",)  # the template asks what the host lacks
