"""The NFD feature file rendered from the KVM health component's state: written when its
text changes, the last pass's device facts kept while the probe fails, a write error said
once."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from ate_devplugin.components import Notice
from ate_devplugin.host.devices import Discovery
from ate_devplugin.kvm import nfd
from ate_devplugin.kvm.facts import DeviceFacts
from ate_devplugin.kvm.probe import ProbeResult
from ate_devplugin.kvm.reasons import Reason
from ate_devplugin.kvmhealth.labels import FeatureFile
from ate_devplugin.kvmstate import KvmChanged, KvmState
from ate_devplugin.tasks import Guard
from ate_devplugin.view import View, build
from tests.unit.kvmhealth.test_monitor import KVM, NODE, FakeProber, Harness, until

DEVICE = DeviceFacts(12, {"max_vcpus": 1024}, "e4da580d", ("cx16", "la57"))


class LearningProber(FakeProber):
    """A probe that passes learns the device's facts."""

    async def probe(self, device: str, timeout: float) -> ProbeResult:
        result = await super().probe(device, timeout)
        return replace(result, device_facts=DEVICE) if result.passed else result


def kvm_view(state: KvmState) -> View:
    """A view of the KVM resource with this state (the feature file renders the state alone)."""
    return build((KVM,), {KVM.name: Discovery(nodes=(), complete=False)}, {KVM.name: state})


def labels(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if not line.startswith("#"))


async def test_the_file_follows_the_verdicts(tmp_path: Path) -> None:
    (tmp_path / "features").mkdir()
    path = tmp_path / "features" / nfd.FILE_NAME
    answer = {"reason": Reason.PASSED}
    h = Harness(tmp_path, LearningProber(lambda device: answer["reason"]))
    file = FeatureFile(str(tmp_path / "features"), "ate.dev", 900)

    def heard(notice: Notice) -> None:
        """As the daemon does: the state told, a view of it rendered."""
        h.heard(notice)
        assert isinstance(notice, KvmChanged)
        file.on_view(kvm_view(notice.states[KVM.name]))

    h.health.tell_to(heard)
    await h.start(KVM)
    try:
        h.discover(1, 3)  # node facts alone
        node_only = labels(path)
        assert node_only["ate.dev/kvmImplementation"] == "pvm"
        assert node_only["ate.dev/kvmHardware"] == "false"
        assert node_only["ate.dev/cpuModelName"] == "Intel-R-Xeon-R-Processor"
        assert "ate.dev/cpuidDigest" not in node_only
        h.discover()  # the real node: probed, passes, its facts learned
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.PASSED)], "passed")
        probed = labels(path)
        assert (probed["ate.dev/cpuidDigest"], probed["ate.dev/kvmApiVersion"]) == ("e4da580d", "12")
        assert (probed["ate.dev/cpuid.cx16"], probed["ate.dev/cpuid.la57"]) == ("true", "true")
        written = path.stat().st_mtime_ns
        answer["reason"] = Reason.RUN
        h.discover(0)
        h.discover()
        await until(lambda: h.told[-1:] == [(KVM.name, Reason.RUN)], "failing")  # the last pass's facts stay
        h.discover(0)  # gone: no verdict
        assert h.told[-1] == (KVM.name, None)
        assert labels(path) == probed
        assert path.stat().st_mtime_ns == written  # equal text: not rewritten, nfd-worker not woken
    finally:
        assert await h.health.stop(2.0) == []


def test_a_directory_it_cannot_write_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    file = FeatureFile(str(tmp_path / "absent"), "ate.dev", 900)
    passed = ProbeResult("/dev/kvm", Reason.PASSED, "passed", 0.001, device_facts=DEVICE)
    for version in (12, 13, 14):  # three states told, each new labels and a write that fails
        file.on_view(kvm_view(KvmState("/dev/kvm", passed, NODE, replace(DEVICE, api_version=version))))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["cannot write the NFD feature file"]


async def test_the_labels_expire_unless_renewed_every_third_of_their_time(tmp_path: Path) -> None:
    """+expiry-time: a daemon that is gone leaves its labels to expire; a running one renews
    them, and a verdict between renewals does not move the time (nor wake nfd-worker)."""
    now = [1_800_000_000.0]
    file = FeatureFile(str(tmp_path), "ate.dev", 0.3, clock=lambda: now[0])
    passed = ProbeResult("/dev/kvm", Reason.PASSED, "passed", 0.001, device_facts=DEVICE)
    file.on_view(kvm_view(KvmState("/dev/kvm", passed, NODE, DEVICE)))

    def expiry() -> str:
        return next(line for line in (tmp_path / nfd.FILE_NAME).read_text().splitlines() if "+expiry-time" in line)

    assert expiry() == "# +expiry-time=2027-01-15T08:00:00Z"  # 1_800_000_000 + 0.3 s, to the second
    now[0] += 100
    file.on_view(kvm_view(KvmState("/dev/kvm", None, NODE, DEVICE)))  # a verdict: the time stays
    assert expiry() == "# +expiry-time=2027-01-15T08:00:00Z"
    await file.start((KVM,), Guard(lambda name, error: None))
    try:
        await until(lambda: expiry() == "# +expiry-time=2027-01-15T08:01:40Z", "renewed", 2)
    finally:
        assert await file.stop(1.0) == []
