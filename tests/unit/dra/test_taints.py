"""Device taints from probe verdicts, and typed attributes within the API's limits."""

from __future__ import annotations

import pytest

from ate_devplugin.dra.attributes import InvalidAttributeError, to_json, typed
from ate_devplugin.dra.taints import DeviceTaint, TaintBook, rfc3339
from ate_devplugin.kvm.attributes import Version
from ate_devplugin.kvm.reasons import Reason

KVM = "ate.dev/kvm"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_failing_resource_is_tainted_since_it_started_failing_until_it_passes() -> None:
    clock = Clock(1_796_292_000.7)  # 2026-12-03T10:00:00.7Z
    book = TaintBook("ate.dev", clock=clock)
    assert book.update(KVM, None) is False  # no verdict yet: no taint
    assert book.taints(KVM) == ()
    assert book.update(KVM, Reason.NOT_KVM) is True
    first = DeviceTaint("ate.dev/kvm-unhealthy", "not-a-kvm-device", "NoSchedule", "2026-12-03T10:00:00Z")
    assert book.taints(KVM) == (first,)
    clock.now += 60
    assert book.update(KVM, Reason.NOT_KVM) is False  # the same: nothing to write
    assert book.update(KVM, Reason.TIMED_OUT) is True  # another reason, the same start
    assert book.taints(KVM) == (DeviceTaint(first.key, "timed-out", "NoSchedule", first.time_added),)
    assert book.update(KVM, Reason.PASSED) is True
    assert book.taints(KVM) == ()
    clock.now += 60
    book.update(KVM, Reason.ENTRY_FAILED)
    assert book.taints(KVM)[0].time_added == "2026-12-03T10:02:00Z"  # a new spell of failing
    assert book.update(KVM, None) is True  # the verdict lost: no taint
    assert book.taints(KVM) == ()
    assert book.taints("ate.dev/other") == ()


def test_the_effect_is_no_schedule_or_no_execute() -> None:
    book = TaintBook("ate.dev", effect="NoExecute", clock=Clock(0))
    book.update(KVM, Reason.RUN)
    assert book.taints(KVM)[0].to_json() == {
        "key": "ate.dev/kvm-unhealthy",
        "value": "run-failed",
        "effect": "NoExecute",
        "timeAdded": "1970-01-01T00:00:00Z",
    }
    with pytest.raises(ValueError, match="taint effect 'PreferNoSchedule': one of NoSchedule, NoExecute"):
        TaintBook("ate.dev", effect="PreferNoSchedule")


def test_time_added_is_to_the_second_in_utc_as_the_api_server_writes_it() -> None:
    assert rfc3339(1_796_292_000.999) == "2026-12-03T10:00:00Z"


def test_attributes_are_typed_as_the_api_spells_them() -> None:
    assert typed(True) == {"bool": True}
    assert typed(6) == {"int": 6}
    assert typed("x" * 70) == {"string": "x" * 64}
    assert typed(Version("6.18.44")) == {"version": "6.18.44"}
    assert typed(Version("1.2.3-rc.1+build.5")) == {"version": "1.2.3-rc.1+build.5"}
    with pytest.raises(InvalidAttributeError, match="not a semantic version"):
        typed(Version("6.18"))


def test_what_the_api_server_would_refuse_is_refused_before_writing() -> None:
    assert to_json({"cpuModel": 167, "resource": "ate.dev/kvm"}, capacities=1) == {
        "cpuModel": {"int": 167}, "resource": {"string": "ate.dev/kvm"},
    }  # fmt: skip
    with pytest.raises(InvalidAttributeError, match="32 attributes and 1 capacities: a device may have 32"):
        to_json({f"a{i}": i for i in range(32)}, capacities=1)
    assert len(to_json({f"a{i}": i for i in range(32)})) == 32
    for bad in ("cpu-model", "1st", "x" * 33, "ate.dev/cpuModel"):
        with pytest.raises(InvalidAttributeError, match="is not a C identifier"):
            to_json({bad: 1})
