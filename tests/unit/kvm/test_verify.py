"""``verify``'s report and exit code for results of each kind (the probe injected: the
report is what is tested here; tests/kvm runs it on the real device)."""

from __future__ import annotations

import io
import json

from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.verify import lines, verify

PVM_NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc-v1147")
PASSED = ProbeResult(
    "/dev/kvm", Reason.PASSED, "/dev/kvm: ok", 0.0079, "10:232", 12, ("out 0x3f8 '4'", "out 0x3f8 '\\n'", "hlt"), True,
    DeviceFacts(12, {}, "e4da580d0f0efc260d1b9abad8ce7814", ("cx16", "x2apic")),
)  # fmt: skip
NOT_KVM = ProbeResult(
    "/dev/kvm", Reason.NOT_KVM, "/dev/kvm: character device 1:3 does not answer KVM_GET_API_VERSION: ENOTTY", 0.0001,
    "1:3",
)  # fmt: skip


def test_a_pass_says_what_ran_where() -> None:
    assert lines(PASSED, PVM_NODE) == [
        "ate-devplugin verify /dev/kvm",
        "  device:          character device 10:232",
        "  KVM API version: 12",
        "  guest exits:     out 0x3f8 '4', out 0x3f8 '\\n', hlt (expected out 0x3f8 '4', out 0x3f8 '\\n', hlt)",
        "  KVM:             pvm, software (no VMX/SVM): small guests run, stock kernels may not",
        '  CPU:             amd64 GenuineIntel family 6 model 167 stepping 1, "Intel(R) Xeon(R) Processor", '
        "a VM itself",
        "  guest CPUID:     e4da580d0f0efc260d1b9abad8ce7814: cx16 x2apic",
        "  kernel:          6.18.44-fc-v1147",
        "PASS: a VM ran guest code on /dev/kvm in 7.9 ms",
    ]


def test_a_failure_ends_with_its_reason_and_the_lines_it_could_fill() -> None:
    hardware = NodeFacts("amd64", "AuthenticAMD", 25, 1, 1, "AMD EPYC 7763", False, "svm", "6.1.0-57-cloud-amd64")
    assert lines(NOT_KVM, hardware) == [
        "ate-devplugin verify /dev/kvm",
        "  device:          character device 1:3",
        "  KVM:             svm, hardware virtualisation",
        '  CPU:             amd64 AuthenticAMD family 25 model 1 stepping 1, "AMD EPYC 7763"',
        "  kernel:          6.1.0-57-cloud-amd64",
        "FAIL not-a-kvm-device: /dev/kvm: character device 1:3 does not answer KVM_GET_API_VERSION: ENOTTY",
    ]


def test_unknown_and_ambiguous_implementations_are_said_plainly() -> None:
    none = NodeFacts("arm64", "", None, None, None, "", False, "", "6.1.0")
    assert "  KVM:             no KVM module loaded" in lines(NOT_KVM, none)
    assert "  CPU:             arm64" in lines(NOT_KVM, none)
    both = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "", True, "pvm+vmx", "6.1.0")
    assert any("pvm+vmx: more than one implementation loaded" in line for line in lines(PASSED, both))
    arm = ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.002, "10:232", 12, (), False, None)
    assert (
        lines(arm, none)[-1]
        == "PASS: a VM and a vCPU were made (guest not run on this architecture) on /dev/kvm in 2.0 ms"
    )


async def test_verify_returns_the_exit_code_and_writes_text_or_json() -> None:
    async def passing(device: str, timeout: float) -> ProbeResult:
        assert (device, timeout) == ("/dev/kvm", 10.0)
        return PASSED

    async def failing(device: str, timeout: float) -> ProbeResult:
        return NOT_KVM

    out = io.StringIO()
    assert await verify(PVM_NODE, out, probe=passing) == 0
    assert out.getvalue().splitlines()[-1].startswith("PASS: ")
    out = io.StringIO()
    assert await verify(PVM_NODE, out, probe=failing, as_json=True) == 1
    data = json.loads(out.getvalue())
    assert (data["result"]["reason"], data["node"]["kvm_implementation"], data["node"]["kvm_hardware"]) == (
        "not-a-kvm-device", "pvm", False,
    )  # fmt: skip


async def test_verify_probes_through_a_child_by_default() -> None:
    out = io.StringIO()
    assert await verify(PVM_NODE, out, device="/dev/null", timeout=10) == 1
    assert out.getvalue().splitlines()[-1] == (
        "FAIL not-a-kvm-device: /dev/null: character device 1:3 does not answer KVM_GET_API_VERSION: "
        "ENOTTY (Inappropriate ioctl for device)"
    )
