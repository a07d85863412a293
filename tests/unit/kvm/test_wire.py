"""The prober's protocol (kvm/wire.py): every field of a message is checked before either
end believes it. Each attack below once got past decode (a CPUID register of -1 or 2**40
killed the KVM health component in cpu/features.py; a TSC of Infinity raised in the
daemon's connection callback); each is now a WireError naming the field, and the fuzz
below holds that nothing else ever comes out of decode."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ate_devplugin.cpu.features import Register, vendor
from ate_devplugin.kvm import wire
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts, cpu_profile
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from tests.harness.fuzz import FUZZ

VENDOR = Register(0, 0, 1)
FACTS = DeviceFacts(12, {"max_vcpus": 1024}, "ab" * 16, ("sse", "vmx"), {VENDOR: 0x756E6547}, 2_995_200)
RESULT = ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.02, "10:232", 12, ("hlt",), True, FACTS)
NODE = NodeFacts("amd64", "GenuineIntel", 6, 85, 7, "Xeon", False, "vmx", "6.1")


def report(**result: Any) -> dict[str, Any]:
    """A prober's report as JSON, with fields of its result replaced (None: removed)."""
    body = {**RESULT.to_json(), **result}
    return {
        "v": 1,
        "report": {"resource": "ate.dev/kvm", "id": 7, "result": {k: v for k, v in body.items() if v is not None}},
    }


def facts(**changed: Any) -> dict[str, Any]:
    return report(device_facts={**FACTS.to_json(), **changed})


def line(data: object) -> bytes:
    return json.dumps(data).encode() + b"\n"


def test_every_message_reads_back_as_written() -> None:
    for message in (
        wire.Hello("ns/prober", {"ate.dev/kvm": "/dev/kvm"}, ids=True),
        wire.Hello("", {}),
        wire.ProbeRequest("ate.dev/kvm", 5.0, 3),
        wire.Report("ate.dev/kvm", RESULT, 3),
        wire.Report("ate.dev/kvm", ProbeResult("/dev/kvm", Reason.RUN, "no", 0.0)),
        wire.Wait("another prober is heard"),
        wire.Restart(),
        wire.Check("/dev/kvm", 4.0),
        wire.Checked(RESULT),
        wire.Checked(ProbeResult("", Reason.PROBER_FAILED, "the probe could not read its request", 0.0)),
    ):
        assert wire.decode(wire.encode(message)) == message


def test_the_messages_of_0_1_0_still_read() -> None:
    """A prober or daemon of the release before ids, during a rolling update of either."""
    assert wire.decode(b'{"v":1,"probe":{"resource":"ate.dev/kvm","timeout_s":5}}') == wire.ProbeRequest(
        "ate.dev/kvm", 5.0
    )
    old = {"v": 1, "report": {"resource": "ate.dev/kvm", "result": RESULT.to_json()}}
    assert wire.decode(line(old)) == wire.Report("ate.dev/kvm", RESULT, None)
    hello = b'{"v":1,"hello":{"pod":"ns/p","devices":{"ate.dev/kvm":"/dev/kvm"}}}'
    assert wire.decode(hello) == wire.Hello("ns/p", {"ate.dev/kvm": "/dev/kvm"}, ids=False)


def test_the_path_is_a_field_and_a_daemon_or_prober_before_it_still_reads() -> None:
    """The result's text comes without its path (``detail``); ``message`` still says both, as
    a daemon before ``detail`` reads it, and a prober before it sends only that."""
    sent = RESULT.to_json()
    assert (sent["device"], sent["detail"], sent["message"]) == ("/dev/kvm", "ok", "/dev/kvm: ok")
    older = {k: v for k, v in sent.items() if k != "detail"}
    message = wire.decode(line({"v": 1, "report": {"resource": "ate.dev/kvm", "result": older}}))
    assert isinstance(message, wire.Report)
    assert (message.result.detail, message.result.message) == ("ok", "/dev/kvm: ok")
    assert message.result == RESULT


# (case, the line, the field the error names): each a fault case of the report's surface
BAD_REPORTS = [
    ("register -1", facts(cpuid_registers={"0x0.0.ebx": -1}), "report.result.device_facts.cpuid_registers"),
    ("register 2**40", facts(cpuid_registers={"0x0.0.ebx": 2**40}), "report.result.device_facts.cpuid_registers"),
    ("register 2**32", facts(cpuid_registers={"0x0.0.ebx": 2**32}), "report.result.device_facts.cpuid_registers"),
    ("register a float", facts(cpuid_registers={"0x0.0.ebx": 1.5}), "report.result.device_facts.cpuid_registers"),
    ("register a bool", facts(cpuid_registers={"0x0.0.ebx": True}), "report.result.device_facts.cpuid_registers"),
    ("register a text", facts(cpuid_registers={"0x0.0.ebx": "0x1"}), "report.result.device_facts.cpuid_registers"),
    ("register key", facts(cpuid_registers={"leaf0": 1}), "report.result.device_facts.cpuid_registers"),
    (
        "registers unbounded",
        facts(cpuid_registers={f"0x{i:x}.0.eax": 1 for i in range(wire.MAX_REGISTERS + 1)}),
        "report.result.device_facts.cpuid_registers",
    ),
    ("tsc 0", facts(tsc_khz=0), "report.result.device_facts.tsc_khz"),
    ("tsc negative", facts(tsc_khz=-1), "report.result.device_facts.tsc_khz"),
    ("tsc a float", facts(tsc_khz=1e6), "report.result.device_facts.tsc_khz"),
    ("tsc 2**32", facts(tsc_khz=2**32), "report.result.device_facts.tsc_khz"),
    ("capability a text", facts(capabilities={"max_vcpus": "many"}), "report.result.device_facts.capabilities"),
    ("capability 2**40", facts(capabilities={"max_vcpus": 2**40}), "report.result.device_facts.capabilities"),
    ("features not texts", facts(cpu_features=[1, 2]), "report.result.device_facts.cpu_features"),
    (
        "features unbounded",
        facts(cpu_features=["x"] * (wire.MAX_FEATURES + 1)),
        "report.result.device_facts.cpu_features",
    ),
    ("digest not hex", facts(cpuid_digest="zz"), "report.result.device_facts.cpuid_digest"),
    ("facts api 2**40", facts(api_version=2**40), "report.result.device_facts.api_version"),
    ("facts a list", report(device_facts=[1]), "report.result.device_facts"),
    ("reason unknown", report(reason="fine"), "report.result.reason"),
    ("passed contradicts", report(reason="run-failed"), "report.result.passed"),
    ("duration negative", report(duration_s=-1), "report.result.duration_s"),
    ("duration 1e300", report(duration_s=1e300), "report.result.duration_s"),
    ("rdev", report(rdev="../x"), "report.result.rdev"),
    ("exits unbounded", report(exits=["x"] * (wire.MAX_ITEMS + 1)), "report.result.exits"),
    ("message huge", report(message="x" * (wire.MAX_TEXT + 1)), "report.result.message"),
    ("detail huge", report(detail="x" * (wire.MAX_TEXT + 1)), "report.result.detail"),
    ("detail a number", report(detail=1), "report.result.detail"),
    ("device missing", report(device=""), "report.result.device"),
    ("api a float", report(api_version=12.5), "report.result.api_version"),
    ("ran_guest a text", report(ran_guest="yes"), "report.result.ran_guest"),
    ("result a list", {"v": 1, "report": {"resource": "ate.dev/kvm", "id": 7, "result": []}}, "report.result"),
]


@pytest.mark.parametrize(("case", "data", "field"), BAD_REPORTS, ids=[c for c, _, _ in BAD_REPORTS])
def test_a_bad_report_is_refused_naming_its_field_and_request(case: str, data: dict[str, Any], field: str) -> None:
    encoded = line(data)
    if len(encoded) > wire.MAX_LINE:
        with pytest.raises(wire.WireError):
            wire.decode(encoded)
        return
    with pytest.raises(wire.WireError) as caught:
        wire.decode(encoded)
    assert (caught.value.field, caught.value.resource, caught.value.request) == (field, "ate.dev/kvm", 7)


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("tsc Infinity", b'{"v":1,"report":{"resource":"r","id":1,"result":{"device_facts":{"tsc_khz":Infinity}}}}'),
        ("timeout NaN", b'{"v":1,"probe":{"resource":"r","timeout_s":NaN}}'),
        ("version true", b'{"v":true,"restart":true}'),
        ("version text", b'{"v":"1","restart":true}'),
        ("two kinds", b'{"v":1,"restart":true,"wait":{"reason":""}}'),
        ("timeout 0", b'{"v":1,"probe":{"resource":"r","timeout_s":0}}'),
        ("timeout a day and more", b'{"v":1,"probe":{"resource":"r","timeout_s":86401}}'),
        ("id negative", b'{"v":1,"probe":{"resource":"r","timeout_s":1,"id":-1}}'),
        ("id 2**64", b'{"v":1,"probe":{"resource":"r","timeout_s":1,"id":18446744073709551616}}'),
        ("id a float", b'{"v":1,"probe":{"resource":"r","timeout_s":1,"id":1.0}}'),
        ("hello ids a text", b'{"v":1,"hello":{"pod":"","devices":{},"ids":"yes"}}'),
        ("hello relative path", b'{"v":1,"hello":{"pod":"","devices":{"r":"dev/kvm"}}}'),
        ("hello pod huge", b'{"v":1,"hello":{"pod":"' + b"x" * 400 + b'","devices":{}}}'),
        ("deep nesting", b'{"v":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("too long", b'{"v":1,"wait":{"reason":"' + b"x" * wire.MAX_LINE + b'"}}'),
    ],
)
def test_other_bad_lines_are_refused(case: str, text: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(text)


def test_a_newer_version_is_told_apart() -> None:
    with pytest.raises(wire.VersionError) as caught:
        wire.decode(b'{"v":2,"hello":{"anything":"new"}}')
    assert caught.value.version == 2
    assert str(caught.value) == "v: protocol version 2; this end speaks 1"


def test_what_decode_lets_through_the_cpu_profile_can_take() -> None:
    """Before: a register of 2**40 reached features.vendor and raised OverflowError there."""
    with pytest.raises(OverflowError):
        vendor({VENDOR: 2**40})
    message = wire.decode(line(facts(cpuid_registers={"0x0.0.ebx": 2**32 - 1})))
    assert isinstance(message, wire.Report)
    assert message.result.device_facts is not None
    cpu_profile(NODE, message.result.device_facts)  # does not raise


# --- fuzz: nothing but a message or a WireError comes out of decode -----------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [k for k in RESULT.to_json() if k != "device_facts"]
FACT_FIELDS = list(FACTS.to_json())


def _believable(message: wire.Message) -> None:
    """What the daemon does with a message it believed must not raise."""
    if isinstance(message, wire.Report) and message.result.device_facts is not None:
        cpu_profile(NODE, message.result.device_facts).to_json()
        wire.encode(message)


@FUZZ
@given(st.sampled_from(FIELDS), json_values)
def test_fuzz_a_field_of_the_result(key: str, value: Any) -> None:
    with contextlib.suppress(wire.WireError):
        _believable(wire.decode(json.dumps(report(**{key: value})).encode()))


@FUZZ
@given(st.sampled_from(FACT_FIELDS), json_values)
def test_fuzz_a_field_of_the_device_facts(key: str, value: Any) -> None:
    with contextlib.suppress(wire.WireError):
        _believable(wire.decode(json.dumps(facts(**{key: value})).encode()))


@FUZZ
@given(st.dictionaries(st.text(max_size=16), st.integers(min_value=-(2**70), max_value=2**70), max_size=8))
def test_fuzz_the_registers(registers: dict[str, int]) -> None:
    with contextlib.suppress(wire.WireError):
        _believable(wire.decode(json.dumps(facts(cpuid_registers=registers)).encode()))


@FUZZ
@given(st.binary(max_size=256) | json_values.map(lambda v: json.dumps({"v": 1, "report": v}).encode()))
def test_fuzz_any_line(data: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        _believable(wire.decode(data))
