"""The probe's verdicts on what any user can make (no root: a missing path, a directory, a
file, a FIFO, /dev/null), the exits KVM can report decoded, the deadline, and the result's
JSON. The probe of a real KVM device is in tests/kvm."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from ate_devplugin.kvm import abi, guest, wire
from ate_devplugin.kvm.facts import DeviceFacts
from ate_devplugin.kvm.probe import Deadline, ProbeResult, check, deadline
from ate_devplugin.kvm.reasons import Reason, StepError


def test_a_missing_node_is_missing(tmp_path: Path) -> None:
    result = check(str(tmp_path / "kvm"), 1.0)
    assert (result.reason, result.passed, result.rdev) == (Reason.MISSING, False, "")
    assert result.message == f"{tmp_path}/kvm: no such device node"


def test_what_is_not_a_character_device_is_not_a_kvm_device(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    seen = {name: check(str(tmp_path / name), 1.0) for name in ("file", "dir", "fifo")}
    assert {name: r.reason for name, r in seen.items()} == dict.fromkeys(seen, Reason.NOT_KVM)
    assert seen["file"].message.endswith("not a character device (a regular file)")
    assert seen["dir"].message.endswith("not a character device (a directory)")
    assert seen["fifo"].message.endswith("not a character device (a FIFO)")


def test_a_character_device_that_is_not_kvm_says_which_and_how_it_answered() -> None:
    result = check("/dev/null", 1.0)  # 1:3, open to everyone
    assert result.reason is Reason.NOT_KVM
    assert result.rdev == "1:3"
    assert result.message == "/dev/null: character device 1:3 does not answer KVM_GET_API_VERSION: ENOTTY " + (
        "(Inappropriate ioctl for device)"
    )
    assert (result.api_version, result.exits, result.device_facts) == (None, (), None)


def test_a_node_under_a_directory_one_cannot_search_is_no_permission(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root searches every directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        result = check(str(locked / "kvm"), 1.0)
    finally:
        locked.chmod(0o700)
    assert result.reason is Reason.NO_PERMISSION
    assert "EACCES" in result.message


def test_the_deadline_interrupts_what_blocks_and_only_within_its_block() -> None:
    start = time.monotonic()
    with pytest.raises(Deadline), deadline(0.05):
        time.sleep(60)  # a blocking call in the kernel, as KVM_RUN is
    assert time.monotonic() - start < 30  # a hang bound, under the sleep: not a speed one
    with deadline(0.05):
        pass
    time.sleep(0.1)  # disarmed: nothing fires after the block


def _run_structure(reason: int, *data: int, fmt: str = "") -> bytearray:
    shared = bytearray(4096)
    struct.pack_into("=I", shared, abi.RUN_EXIT_REASON, reason)
    if fmt:
        struct.pack_into(fmt, shared, abi.RUN_EXIT_DATA, *data)
    return shared


@pytest.mark.parametrize(
    ("reason", "fmt", "data", "code", "text"),
    [
        (abi.EXIT_FAIL_ENTRY, "=QI", (0x7, 0), Reason.ENTRY_FAILED,
         "KVM_EXIT_FAIL_ENTRY: the CPU refused to enter the guest, hardware error 0x7"),
        (abi.EXIT_INTERNAL_ERROR, "=II", (1, 0), Reason.INTERNAL_ERROR,
         "KVM_EXIT_INTERNAL_ERROR: suberror 1 (emulation failure) after out 0x3f8 '4'"),
        (abi.EXIT_SHUTDOWN, "", (), Reason.RUN,
         "KVM_EXIT_SHUTDOWN: the guest shut down (triple fault) after out 0x3f8 '4'"),
        (abi.EXIT_UNKNOWN, "=Q", (0x21,), Reason.RUN,
         "KVM_EXIT_UNKNOWN: hardware exit reason 0x21 after out 0x3f8 '4'"),
        (6, "", (), Reason.WRONG_EXIT, "the guest stopped at KVM_EXIT_MMIO after out 0x3f8 '4'; expected "
         "out 0x3f8 '4', out 0x3f8 '\\n', hlt"),
        (99, "", (), Reason.WRONG_EXIT, "the guest stopped at KVM_EXIT_99 after out 0x3f8 '4'; expected "
         "out 0x3f8 '4', out 0x3f8 '\\n', hlt"),
    ],
)  # fmt: skip
def test_each_exit_the_program_never_makes_is_a_reason_with_what_kvm_said(
    reason: int, fmt: str, data: tuple[int, ...], code: Reason, text: str
) -> None:
    with pytest.raises(StepError) as failed:
        guest._fail_on_exit(reason, _run_structure(reason, *data, fmt=fmt), [guest.EXPECTED[0]])
    assert (failed.value.reason, failed.value.message) == (code, text)


def test_a_result_goes_through_json_unchanged() -> None:
    """Through the probe's pipe, as the worker writes it and the runner reads it (kvm/wire.py)."""

    def through_the_pipe(data: dict[str, Any]) -> ProbeResult:
        message = wire.decode(json.dumps({"v": wire.VERSION, "checked": {"result": data}}).encode())
        assert isinstance(message, wire.Checked)
        return message.result

    facts = DeviceFacts(12, {"max_vcpus": 1024, "irqchip": 1}, "0" * 32, ("cx16", "x2apic"))
    result = ProbeResult("/dev/kvm", Reason.PASSED, "ok", 0.0071, "10:232", 12, ("out 0x3f8 '4'", "hlt"), True, facts)
    assert through_the_pipe(result.to_json()) == result
    assert result.to_json()["passed"] is True
    failed = ProbeResult("/dev/kvm", Reason.TIMED_OUT, "late", 5.0)
    assert through_the_pipe(failed.to_json()) == failed
    with pytest.raises(ValueError, match="no-such-reason"):
        through_the_pipe({**failed.to_json(), "reason": "no-such-reason"})


def test_every_reason_code_is_a_valid_label_value() -> None:
    """They become taint values and metric labels: at most 63 of [A-Za-z0-9-_.], alphanumeric ends."""
    for reason in Reason:
        assert len(reason) <= 63
        assert reason.replace("-", "").isalnum()
        assert reason[0].isalnum()
        assert reason[-1].isalnum()
