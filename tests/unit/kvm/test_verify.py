"""``verify``'s report and exit code for results of each kind (the probe injected: the
report is what is tested here; tests/kvm runs it on the real device)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from ate_devplugin.kvm.access import Identity, Node, current_identity, read_node
from ate_devplugin.kvm.facts import DeviceFacts, NodeFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvm.verify import lines, verify

PVM_NODE = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor", True, "pvm", "6.18.44-fc-v1147")
PASSED = ProbeResult(
    "/dev/kvm", Reason.PASSED, "ok", 0.0079, "10:232", 12, ("out 0x3f8 '4'", "out 0x3f8 '\\n'", "hlt"), True,
    DeviceFacts(12, {}, "e4da580d0f0efc260d1b9abad8ce7814", ("cx16", "x2apic")),
)  # fmt: skip
ROOT_0600 = Node(0o20600, 0, 0)  # crw------- root:root
ROOT_NO_CAPS = Identity(0, 0, (0,), 0)
NOT_KVM = ProbeResult(
    "/dev/kvm", Reason.NOT_KVM, "character device 1:3 does not answer KVM_GET_API_VERSION: ENOTTY", 0.0001,
    "1:3",
)  # fmt: skip


def test_a_pass_says_what_ran_where() -> None:
    assert lines(PASSED, PVM_NODE, ROOT_0600, ROOT_NO_CAPS) == [
        "ate-devplugin verify /dev/kvm",
        "  device:          character device 10:232, crw------- (0600) owner 0:0 here",
        "  process:         uid 0, gid 0, groups 0; no capabilities",
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
    null = Node(0o20666, 0, 0)
    assert lines(NOT_KVM, hardware, null, Identity(10001, 10001, (10001,), 0)) == [
        "ate-devplugin verify /dev/kvm",
        "  device:          character device 1:3, crw-rw-rw- (0666) owner 0:0 here",
        "  process:         uid 10001, gid 10001, groups 10001; no capabilities",
        "  KVM:             svm, hardware virtualisation",
        '  CPU:             amd64 AuthenticAMD family 25 model 1 stepping 1, "AMD EPYC 7763"',
        "  kernel:          6.1.0-57-cloud-amd64",
        "FAIL not-a-kvm-device: /dev/kvm: character device 1:3 does not answer KVM_GET_API_VERSION: ENOTTY",
    ]


def test_unknown_and_ambiguous_implementations_are_said_plainly() -> None:
    none = NodeFacts("arm64", "", None, None, None, "", False, "", "6.1.0")
    assert "  KVM:             no KVM module loaded" in lines(NOT_KVM, none, None, ROOT_NO_CAPS)
    assert "  CPU:             arm64" in lines(NOT_KVM, none, None, ROOT_NO_CAPS)
    both = NodeFacts("amd64", "GenuineIntel", 6, 167, 1, "", True, "pvm+vmx", "6.1.0")
    report = lines(PASSED, both, ROOT_0600, ROOT_NO_CAPS)
    assert any("pvm+vmx: more than one implementation loaded" in line for line in report)
    arm = ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.002, "10:232", 12, (), False, None)
    assert (
        lines(arm, none, None, ROOT_NO_CAPS)[-1]
        == "PASS: a VM and a vCPU were made (guest not run on this architecture) on /dev/kvm in 2.0 ms"
    )


def denied(mode: int, gid: int = 0, errno_name: str = "EACCES (Permission denied)") -> ProbeResult:
    return ProbeResult("/dev/kvm", Reason.NO_PERMISSION, f"opening character device 10:232: {errno_name}",
                       0.001, "10:232")  # fmt: skip


NON_ROOT = Identity(10001, 10001, (10001,), 0)


def refused_rows(report: list[str]) -> list[str]:
    """The rows before the verdict that explain a refusal, without their labels."""
    start = next(i for i, line in enumerate(report) if line.startswith("  refused:"))
    return [line[19:] for line in report[start:-1]]


@pytest.mark.parametrize(
    ("node", "who", "cause", "changes"),
    [
        # 0600 root:root with the runtime's default device ownership: only the owner's bits.
        (Node(0o20600, 0, 0), NON_ROOT, "its mode gives uid 10001 (groups 10001) no read-write access",
         ["run as uid 0 with every capability dropped (root without CAP_DAC_OVERRIDE has the owner's bits only)"]),
        # 0660 root:kvm (Debian, Ubuntu): the owner's bits or the group's.
        (Node(0o20660, 0, 36), NON_ROOT, "its mode gives uid 10001 (groups 10001) no read-write access",
         ["run as uid 0 with every capability dropped (root without CAP_DAC_OVERRIDE has the owner's bits only)",
          "add gid 36, the node's group, to the pod's supplementalGroups (it may differ by node)"]),
        # Owned by another user (device ownership for another pod's user): that user.
        (Node(0o20600, 10002, 10002), NON_ROOT, "its mode gives uid 10001 (groups 10001) no read-write access",
         ["run as uid 10002"]),
        # Root, but the node is 0000: nothing of the owner's to use.
        (Node(0o20000, 0, 0), ROOT_NO_CAPS, "its mode gives uid 0 (groups 0) no read-write access", []),
    ],
)  # fmt: skip
def test_a_refused_open_says_the_nodes_mode_and_what_to_change(
    node: Node, who: Identity, cause: str, changes: list[str]
) -> None:
    report = lines(denied(node.mode), PVM_NODE, node, who)
    rows = refused_rows(report)
    print("\n".join(report))
    assert report[-1] == "FAIL no-permission: /dev/kvm: opening character device 10:232: EACCES (Permission denied)"
    assert rows[0].startswith(cause + " (the runtime copies the host node's mode and owner unless its device ")
    # What applies to this node first, then what works everywhere; one a line, the first labelled.
    assert [row.removeprefix("or ") for row in rows[1:]] == [
        *changes,
        "give the node to the pod's user: device_ownership_from_security_context = true in the runtime "
        "(containerd, CRI-O)",
        'give the resource a CDI mode: cdi: {file_mode: "0666"} with allocate: cdi (containerd 2)',
        'make the node 0666 on the host (a udev rule: KERNEL=="kvm", MODE="0666")',
    ]
    assert all(row.startswith("or ") for row in rows[2:])
    assert report[-len(rows)].startswith("  to open it:      ")


def test_a_mode_that_allows_it_points_at_the_device_rules_or_a_security_module() -> None:
    node = Node(0o20666, 0, 0)
    cgroup = refused_rows(lines(denied(node.mode, errno_name="EPERM (Operation not permitted)"), PVM_NODE, node,
                                NON_ROOT))  # fmt: skip
    assert cgroup == [
        "its mode lets uid 10001 read and write it, but the container's device rules do not",
        "ask for the device as a pod does (resources.limits or a claim): the runtime then allows it",
        "or give the resource read-write permissions (deviceConfig.resources[].permissions: rw)",
    ]
    lsm = refused_rows(lines(denied(node.mode), PVM_NODE, node, NON_ROOT))
    assert lsm == ["its mode lets uid 10001 read and write it: a security module (SELinux, AppArmor) refused"]
    # CAP_DAC_OVERRIDE passes any mode: what refuses then is not the mode.
    overriding = Identity(0, 0, (0,), 1 << 1)
    assert refused_rows(lines(denied(0o20000), PVM_NODE, Node(0o20000, 5, 5), overriding))[0].startswith(
        "its mode lets uid 0 read and write it"
    )


def test_the_identity_is_this_process_and_a_node_that_cannot_be_stated_is_none(tmp_path: Path) -> None:
    me = current_identity()
    assert (me.uid, me.gid) == (os.geteuid(), os.getegid())
    assert set(os.getgroups()) <= set(me.groups)
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t00000000a80425fb\n")
    assert current_identity(str(status)).capabilities == 0xA80425FB
    status.write_text("Name:\tx\n")
    assert current_identity(str(status)).describe().endswith("; capabilities unknown")
    assert read_node(str(tmp_path / "absent")) is None
    node = read_node(str(status))
    assert node is not None
    assert (node.uid, node.gid) == (os.geteuid(), os.getegid())


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
    assert "refused" not in data["access"]

    async def refused(device: str, timeout: float) -> ProbeResult:
        return denied(0o20600)

    out = io.StringIO()
    assert await verify(PVM_NODE, out, device="/dev/null", probe=refused, as_json=True) == 1
    seen = json.loads(out.getvalue())["access"]
    assert seen["device_node"] == {"mode": "0666", "type": "c", "uid": 0, "gid": 0}  # /dev/null, stat'ed here
    assert seen["process"]["uid"] == os.geteuid()
    assert seen["refused"].startswith(f"its mode lets uid {os.geteuid()} read and write it")


async def test_verify_probes_through_a_child_by_default() -> None:
    out = io.StringIO()
    assert await verify(PVM_NODE, out, device="/dev/null", timeout=10) == 1
    assert out.getvalue().splitlines()[-1] == (
        "FAIL not-a-kvm-device: /dev/null: character device 1:3 does not answer KVM_GET_API_VERSION: "
        "ENOTTY (Inappropriate ioctl for device)"
    )
